#!/usr/bin/env bash
# `make test`: every test, in pytest processes that each write JUnit XML into build/, with the real
# servers built and started beside the tests that do not need them.
#
#   1. scripts/infra/up.sh starts in the background (log build/infra-up.log): first Kafka and MinIO (the
#      servers most tests need; a few minutes cold), then the rest. It builds what the cache lacks (niced;
#      about 35 minutes on a new machine, nothing when cached) and writes build/infra.env as each group is up.
#   2. At once, three streams side by side (the servers' tests mostly wait on servers, Pods and the bus, so
#      they fill the CPU the others leave idle):
#      a. the tests that need servers but the real node (SCALERL_INFRA_UP_PID: a session fixture whose
#         servers are not up yet waits for the background up.sh instead of failing):
#           the main suite's                         -m infra                build/junit-infra.xml
#      c. the real node's tests (tests/real_node), the same way       build/junit-real-node.xml
#      b. the tests that need no server (SCALERL_INFRA_AUTOSTART=0, so a test that needs one and is not
#         marked `infra` fails in CI instead of starting servers of its own):
#           the main suite's                           -m "not infra"          build/junit.xml
#           the tests that train, on other CPU kernels  ATEN_CPU_CAPABILITY     build/junit-<kernels>.xml
#      then, in the streams that end first, the vLLM environment's two passes:
#           the tests that need no server               -m "vllm and not infra" build/junit-vllm.xml
#           once every server is up, those that need them -m "vllm and infra"   build/junit-vllm-infra.xml
#      Tried and undone (2026-12-07): tests/k8s in their own pass, taken by whichever stream reached them
#      first with nothing else to do. Warm, the main suite's pass slowed from 17-20 to 29 min beside the
#      real node's tests (which the API-server tests had sat between), and the run took longer: the machine
#      is CPU-bound through both streams, so moving tests between them does not shorten it.
#   3. The servers stop.
# Every pass runs whatever the others did; the exit status is the first non-zero one (pytest's 5, no
# tests collected, included), or 1 when the servers could not be built or started.
#
# Env (set by the Makefile): PY (the project environment's python), VLLM_PY (the vLLM environment's),
# ALT_KERNELS (the other kernels: avx2 or default), RETRAIN_TESTS, PYTEST_ARGS (extra pytest arguments
# for the main suite's passes).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
if [[ "${1:-}" == --prebuild ]]; then
    # Before make test installs the environments (minutes of downloads cold): the servers' and the image's
    # builds start, in the background, needing no environment (log build/infra-prebuild.log).
    rm -f build/infra-prebuild-km build/infra-prebuild.rc
    # Not niced here: the servers' builds, then the tests that need them, are the run's longest path (the
    # cold run of 2026-11-28, builds at nice 10 beside the tests: the last server about an hour in); the
    # tests that need no server fill the CPU they leave.
    # Three at once: Prometheus and Jaeger (the longest of the observability lane, needed last); Kafka and
    # MinIO (most tests need them: their tests start as soon as they are built), then the rest in up.sh's
    # two lanes (the API servers and the node; kwok, Kueue and cert-manager).
    SCALERL_BUILD_NICE="${SCALERL_BUILD_NICE:-0}" nohup bash -c '
        up=scripts/infra/up.sh
        bash "$up" --build-only prometheus jaeger >build/infra-prebuild-obs.log 2>&1 &
        obs=$!
        bash "$up" --build-only kafka minio && touch build/infra-prebuild-km \
            && bash "$up" --build-only kafka minio k8s cluster kueue certmanager node
        rc=$?
        wait "$obs"
        o=$?
        ((rc != 0)) || rc=$o
        echo "$rc" >build/infra-prebuild.rc' >build/infra-prebuild.log 2>&1 </dev/null &
    echo $! >build/infra-prebuild.pid
    echo "make test: building what the cache lacks of the servers in the background: build/infra-prebuild.log"
    exit 0
fi
: "${PY:?PY: the project environment's python}" "${VLLM_PY:?VLLM_PY: the vLLM environment's python}"
: "${ALT_KERNELS:?ALT_KERNELS: avx2 or default}" "${RETRAIN_TESTS:?RETRAIN_TESTS: the folders of the tests that train}"
read -r -a extra <<<"${PYTEST_ARGS:-}"
read -r -a retrain <<<"$RETRAIN_TESTS"
T0=$SECONDS
rc=0
note() { printf 'make test [%dm%02ds]: %s\n' $(((SECONDS - T0) / 60)) $(((SECONDS - T0) % 60)) "$*"; }
keep() { local s=$1; ((rc != 0)) || rc=$s; ((s == 0)) || note "that pass exited $s"; }
vllm_pytest() { # the vLLM tests run from the checkout in the vLLM environment (its own torch)
    PY="$PY" VLLM_PY="$VLLM_PY" bash scripts/vllm_python.sh -m pytest -p no:cacheprovider tests/vllm_cpu "$@"
}

rm -f build/infra.env build/infra-up.rc build/infra-stream.rc build/real-node-stream.rc # infra.env: written by up.sh as the servers come up
# The vLLM environment's two passes run at the end of whichever streams end first: each stream, as it ends,
# takes the passes no other has taken (the one that makes a pass's directory runs it). History: run after the
# servers' tests (67d974e), since that stream ended first; run by whichever stream ended first (99af1ef), they
# slowed the real node's tests, then the last of the servers' pass, by 5 min. The real node's tests now have
# a stream of their own, which ends first (the warm run of 2026-12-07 at 94f292c: 21 min, the other servers'
# 26, the no-server stream 28, then the vLLM test on the servers at its end: 32 min 46 s in all).
rm -rf build/vllm-plain.claim build/vllm-infra.claim
vllm_run() { # $1: the tests' marker expression, $2: the log, $3: the JUnit file; $4 = infra: under build/infra.env
    (
        if [[ ${4:-} == infra ]]; then
            set -a
            # shellcheck source=/dev/null
            source build/infra.env
            set +a
        fi
        SCALERL_INFRA_AUTOSTART=0 vllm_pytest -m "$1" --junitxml="$3" >"$2" 2>&1
    )
    keep $?
    tail -n 5 "$2" | grep -E "passed|failed|error" | sed 's/^/    /'
}
vllm_plain() {
    note "the vLLM tests that need no server, in $VLLM_PY: build/vllm-tests.log"
    vllm_run "vllm and not infra" build/vllm-tests.log build/junit-vllm.xml
}
vllm_infra() { # once every server is up
    note "the vLLM tests that need the servers, once all are up: build/vllm-infra-tests.log"
    while [[ ! -s build/infra-up.rc ]]; do sleep 5; done
    if [[ "$(cat build/infra-up.rc)" != 0 ]]; then
        note "the servers could not be built or started (build/infra-up.log): the vLLM tests that need them did not run"
        return 0 # (the run fails on infra-up.rc at its end)
    fi
    vllm_run "vllm and infra" build/vllm-infra-tests.log build/junit-vllm-infra.xml infra
}
vllm_passes_left() { # run the vLLM passes no stream has taken yet
    local pass
    for pass in plain infra; do
        ! mkdir "build/vllm-$pass.claim" 2>/dev/null || "vllm_$pass"
    done
}
# `--prebuild` (make test, before it installs the environments) already builds what the cache lacks, Kafka
# and MinIO first; the servers start as their builds are done.
prebuilt() { # wait for the prebuild's marker $1 (or its end); false when it failed
    local pid
    pid="$(cat build/infra-prebuild.pid 2>/dev/null || true)"
    [[ -n "$pid" ]] || return 0
    while [[ ! -e "build/$1" && ! -s build/infra-prebuild.rc ]] && kill -0 "$pid" 2>/dev/null; do sleep 5; done
    [[ -e "build/$1" ]] || [[ "$(cat build/infra-prebuild.rc 2>/dev/null || echo 0)" == 0 ]]
}
( (prebuilt infra-prebuild-km && bash scripts/infra/up.sh kafka minio && prebuilt infra-prebuild.rc \
     && bash scripts/infra/up.sh) >build/infra-up.log 2>&1
  echo $? >build/infra-up.rc ) &
up_pid=$!
note "building (where the cache lacks them) and starting the servers in the background: build/infra-up.log"

# servers_stream NAME PYTEST-ARGS...: a pass of tests that need the servers (each waits for its servers), log
# build/NAME-tests.log, JUnit build/junit-NAME.xml, status in build/NAME-stream.rc
servers_stream() {
    local name=$1
    shift
    (
        # (a subshell: `keep` sets its own copy of rc)
        note "$name: tests that need the servers (each waits for its servers): build/$name-tests.log"
        SCALERL_INFRA_AUTOSTART=0 SCALERL_INFRA_UP_PID=$up_pid "$PY" -m pytest -m "infra and not gpu and not vllm" \
            --junitxml="build/junit-$name.xml" "${extra[@]}" "$@" >"build/$name-tests.log" 2>&1
        keep $?
        tail -n 15 "build/$name-tests.log" | grep -E "passed|failed|error" | sed "s/^/    $name: /"
        vllm_passes_left
        echo "$rc" >"build/$name-stream.rc"
    ) &
}
# stream a: the tests that need the servers but the real node; c: the real node's (they mostly wait on Pods:
# in one pass with the others, its 35 min of waits were the run's longest path, the machine 21-46% busy in
# its last 6 min; 2026-12-07)
servers_stream infra --ignore=tests/real_node
stream_pid=$!
servers_stream real-node tests/real_node
node_stream_pid=$!

# stream b: the tests that need no server
note "the tests that need no server"
SCALERL_INFRA_AUTOSTART=0 "$PY" -m pytest -m "not gpu and not vllm and not infra" \
    --junitxml=build/junit.xml "${extra[@]}"
keep $?
note "the tests that train, again with ATEN_CPU_CAPABILITY=$ALT_KERNELS"
ATEN_CPU_CAPABILITY="$ALT_KERNELS" SCALERL_INFRA_AUTOSTART=0 "$PY" -m pytest -p no:cacheprovider \
    -m "not gpu and not infra and not slow and not vllm and not one_kernel" \
    --junitxml="build/junit-$ALT_KERNELS.xml" "${retrain[@]}"
keep $?

vllm_passes_left
note "waiting for the tests that need the servers"
wait "$stream_pid" "$node_stream_pid"
keep "$(cat build/infra-stream.rc 2>/dev/null || echo 1)"
keep "$(cat build/real-node-stream.rc 2>/dev/null || echo 1)"
wait "$up_pid"
if [[ "$(cat build/infra-up.rc 2>/dev/null)" == 0 ]]; then
    grep -hE "built in|fetched in|made in|build done|up in|imported in" build/infra-prebuild*.log build/infra-up.log \
        | sed 's/^/    /'
else
    tail -n 25 build/infra-prebuild.log build/infra-prebuild-obs.log build/infra-up.log 2>/dev/null
    note "the servers could not be built or started (build/infra-up.log above)"
    keep 1
fi
for log in infra-tests real-node-tests vllm-tests vllm-infra-tests; do # the background stream's logs: their failures here
    if ((rc != 0)) && grep -q "= FAILURES =\|= ERRORS =" "build/$log.log" 2>/dev/null; then
        note "the failures in build/$log.log:"
        sed -n '/= FAILURES =\|= ERRORS =/,$p' "build/$log.log" | tail -n 300
    fi
done
bash scripts/infra/down.sh >/dev/null 2>&1 || true
note "done, exit $rc"
exit "$rc"
