#!/usr/bin/env bash
# `make test`: every test, in pytest processes that each write JUnit XML into build/, with the real
# servers built and started beside the tests that do not need them.
#
#   1. scripts/infra/up.sh starts in the background (log build/infra-up.log): it builds what the cache
#      lacks (niced; about 35 minutes on a new machine, nothing when cached) and starts the servers.
#   2. Meanwhile, the tests that need no server (SCALERL_INFRA_AUTOSTART=0, so a test that needs one
#      and is not marked `infra` fails in CI instead of starting servers of its own):
#        the main suite's                           -m "not infra"          build/junit.xml
#        the vLLM environment's                     -m "vllm and not infra" build/junit-vllm.xml
#        the tests that train, on other CPU kernels  ATEN_CPU_CAPABILITY     build/junit-<kernels>.xml
#   3. Once the servers are up, the tests that need them:
#        the main suite's                           -m infra                build/junit-infra.xml
#        the vLLM environment's                     -m "vllm and infra"     build/junit-vllm-infra.xml
#   4. The servers stop.
# Every pass runs whatever the others did; the exit status is the first non-zero one (pytest's 5, no
# tests collected, included), or 1 when the servers could not be built or started.
#
# Env (set by the Makefile): PY (the project environment's python), VLLM_PY (the vLLM environment's),
# ALT_KERNELS (the other kernels: avx2 or default), RETRAIN_TESTS, PYTEST_ARGS (extra pytest arguments
# for the main suite's passes).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${PY:?PY: the project environment's python}" "${VLLM_PY:?VLLM_PY: the vLLM environment's python}"
: "${ALT_KERNELS:?ALT_KERNELS: avx2 or default}" "${RETRAIN_TESTS:=tests/unit tests/e2e}"
read -r -a extra <<<"${PYTEST_ARGS:-}"
read -r -a retrain <<<"$RETRAIN_TESTS"
mkdir -p build
T0=$SECONDS
rc=0
note() { printf 'make test [%dm%02ds]: %s\n' $(((SECONDS - T0) / 60)) $(((SECONDS - T0) % 60)) "$*"; }
keep() { local s=$1; ((rc != 0)) || rc=$s; ((s == 0)) || note "that pass exited $s"; }
vllm_pytest() { # the vLLM tests run from the checkout in the vLLM environment (its own torch)
    PY="$PY" VLLM_PY="$VLLM_PY" bash scripts/vllm_python.sh -m pytest -p no:cacheprovider tests/vllm_cpu "$@"
}

rm -f build/infra.env # written by up.sh once the servers are up
bash scripts/infra/up.sh >build/infra-up.log 2>&1 &
up_pid=$!
note "building (where the cache lacks them) and starting the servers in the background: build/infra-up.log"

note "the tests that need no server"
SCALERL_INFRA_AUTOSTART=0 "$PY" -m pytest -m "not gpu and not vllm and not infra" \
    --junitxml=build/junit.xml "${extra[@]}"
keep $?
note "the vLLM tests that need no server, in $VLLM_PY"
SCALERL_INFRA_AUTOSTART=0 vllm_pytest -m "vllm and not infra" --junitxml=build/junit-vllm.xml
keep $?
note "the tests that train, again with ATEN_CPU_CAPABILITY=$ALT_KERNELS"
ATEN_CPU_CAPABILITY="$ALT_KERNELS" SCALERL_INFRA_AUTOSTART=0 "$PY" -m pytest -p no:cacheprovider \
    -m "not gpu and not infra and not slow and not vllm" --junitxml="build/junit-$ALT_KERNELS.xml" "${retrain[@]}"
keep $?

note "waiting for the servers"
if wait "$up_pid"; then
    grep -E "built in|fetched in|build done|up in" build/infra-up.log | sed 's/^/    /'
    set -a
    # shellcheck source=/dev/null
    source build/infra.env
    set +a
    note "the tests that need the servers"
    "$PY" -m pytest -m "infra and not gpu and not vllm" --junitxml=build/junit-infra.xml "${extra[@]}"
    keep $?
    note "the vLLM tests that need the servers"
    vllm_pytest -m "vllm and infra" --junitxml=build/junit-vllm-infra.xml
    keep $?
else
    s=$?
    tail -n 40 build/infra-up.log
    note "the servers could not be built or started (exit $s; build/infra-up.log above): the tests that need them did not run"
    keep 1
fi
bash scripts/infra/down.sh >/dev/null 2>&1 || true
note "done, exit $rc"
exit "$rc"
