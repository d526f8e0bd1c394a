# shellcheck shell=bash
# Shared helpers for scripts/infra/{up,down,restart_kafka}.sh. Sourced, never run.
#
# Layout
#   cache (outside the checkout, reused across clones):  ${SCALERL_CACHE:-$HOME/.cache/scalerl}
#     kafka-<version>-<pomhash>/libs/*.jar     broker runtime jars fetched by Maven
#     bin/minio-<pseudo-version>               MinIO server built with `go install`
#   state (inside the checkout, git-ignored):            build/infra/
#     kafka/{server.properties,log4j2.properties,data/,kafka.log,pid,port,cport}
#     minio/{data/,minio.log,pid,port,credentials}
#   build/infra.env                                      what clients and tests read

set -euo pipefail

INFRA_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$INFRA_DIR/../.." && pwd)"
CACHE="${SCALERL_CACHE:-$HOME/.cache/scalerl}"
# (both overridable: a test's private broker, tests/integration/conftest.py `private_kafka`, lives apart)
STATE="${SCALERL_INFRA_STATE:-$REPO_ROOT/build/infra}"
ENV_FILE="${SCALERL_INFRA_ENV:-$REPO_ROOT/build/infra.env}"

# ---- pinned versions ------------------------------------------------------------------------------
# Kafka and its logging backend are pinned in kafka/pom.xml; this must match <kafka.version> there.
KAFKA_VERSION="4.1.1"
MAVEN_DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
# MinIO's repository is archived and only has RELEASE.* tags, so it is pinned by pseudo-version.
# The pseudo-version of RELEASE.2025-10-15T17-29-55Z (v0.0.0-20251015172955-9e49d5e7a648) is refused
# by the module proxy reachable here ("not available"); this is the newest commit it serves.
MINIO_MODULE="github.com/minio/minio"
MINIO_VERSION="${SCALERL_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"

KAFKA_HEAP="${SCALERL_KAFKA_HEAP:--Xmx512m}"
KAFKA_JVM_OPTS="${SCALERL_KAFKA_JVM_OPTS:--Xms128m -XX:+UseG1GC -XX:MaxGCPauseMillis=20}"
KAFKA_READY_TIMEOUT="${SCALERL_KAFKA_READY_TIMEOUT:-120}"
MINIO_READY_TIMEOUT="${SCALERL_MINIO_READY_TIMEOUT:-60}"
STOP_GRACE="${SCALERL_STOP_GRACE:-20}"

log() { printf '[infra %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}s')" "$1" "$(now)"; }

kafka_home() {
    local h
    h="$(sha256sum "$INFRA_DIR/kafka/pom.xml" | cut -c1-10)"
    echo "$CACHE/kafka-$KAFKA_VERSION-$h"
}
minio_bin() { echo "$CACHE/bin/minio-$MINIO_VERSION"; }

# A free TCP port on 127.0.0.1 (the kernel picks it; racy only against other port pickers).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# True when nothing listens on 127.0.0.1:$1 and we may bind it.
port_free() {
    python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}

# The port stored in $1 if it is still free, else a new free one.
reuse_or_pick_port() {
    local file="$1" p=""
    [[ -s "$file" ]] && p="$(cat "$file")"
    if [[ -n "$p" ]] && port_free "$p"; then echo "$p"; else free_port; fi
}

# pid_alive PID PATTERN: the process exists and its command line contains PATTERN (guards against
# a recycled PID belonging to something else).
pid_alive() {
    local pid="$1" pattern="$2"
    [[ -n "$pid" ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    # No `tr | grep -q` pipeline: under pipefail, grep -q exiting early can SIGPIPE tr and fail it.
    local cmdline
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmdline" == *"$pattern"* ]]
}

read_pid() { if [[ -s "$1" ]]; then cat "$1"; fi; }

# stop_pid PID PATTERN NAME [signal]: SIGTERM (or the given signal), wait $STOP_GRACE s, then SIGKILL.
stop_pid() {
    local pid="$1" pattern="$2" name="$3" sig="${4:-TERM}" t0
    pid_alive "$pid" "$pattern" || return 0
    t0="$(now)"
    log "$name: sending SIG$sig to pid $pid"
    kill -s "$sig" "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_GRACE))
    while pid_alive "$pid" "$pattern" && ((SECONDS < deadline)); do sleep 0.2; done
    if pid_alive "$pid" "$pattern"; then
        log "$name: still running after ${STOP_GRACE}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    log "$name: stopped in $(elapsed "$t0")"
}

# spawn PIDFILE LOGFILE CMD...: start CMD in its own session (so it outlives this shell and the
# caller's process group), stdout+stderr appended to LOGFILE; the PID written is CMD's own.
spawn() {
    local pidfile="$1" logfile="$2"
    shift 2
    rm -f "$pidfile"
    printf '\n===== %s starting: %s\n' "$(date -Is)" "$*" >>"$logfile"
    # The server runs as a child of a small watcher in its own session: the pid file names the server,
    # and when it ends the watcher appends its exit status (or signal) to the log, so a server that
    # dies without a word (SIGKILL, OOM) still says how it ended.
    # shellcheck disable=SC2016
    setsid bash -c '"$@" & echo $! >"$0"; wait $!; rc=$?
        if ((rc > 128)); then echo "===== exited on signal $((rc - 128)) (status $rc)"
        else echo "===== exited with status $rc"; fi' "$pidfile" "$@" >>"$logfile" 2>&1 </dev/null 9>&- &
    local _
    for _ in $(seq 1 50); do [[ -s "$pidfile" ]] && return 0; sleep 0.1; done
    die "could not start $1 (no pid file $pidfile); see $logfile"
}

# with_build_lock KEY CMD...: run CMD holding $CACHE/.build-KEY.lock, so that two processes (two
# checkouts, or make and a test) never build the same thing into the cache at once; builds of different
# KEYs (up.sh's two lanes) run side by side.
with_build_lock() {
    local lock="$CACHE/.build-$1.lock"
    shift
    mkdir -p "$CACHE"
    exec 9>"$lock"
    if ! flock -n 9; then
        log "another build holds $lock; waiting"
        flock 9
    fi
    "$@" 9>&-  # what CMD starts must not inherit the lock (a daemon would hold it for its lifetime)
    flock -u 9
    exec 9>&-
}

# replace_dir DEST FILE...: DEST becomes a folder holding copies of exactly FILE... (filled beside it, then
# moved into place, so a reader never sees half of it).
replace_dir() {
    local dest="$1"
    shift
    rm -rf "$dest.tmp.$$"
    mkdir -p "$dest.tmp.$$"
    cp "$@" "$dest.tmp.$$/"
    rm -rf "$dest"
    mv "$dest.tmp.$$" "$dest"
}

# run_component NAME ACTION: a component script (kueue.sh, certmanager.sh) run on its own: build | up |
# down | env, with its functions build_NAME, up_NAME, down_NAME and NAME_env_lines.
run_component() {
    case "${2:-}" in
        build) "build_$1" ;;
        up) "build_$1" && "up_$1" && "$1_env_lines" ;;
        down) "down_$1" ;;
        env) "$1_env_lines" ;;
        *) die "usage: scripts/infra/$1.sh build|up|down|env" ;;
    esac
}

# go_install_to BIN PKG@VERSION [LDFLAGS]: `go install` into a scratch GOBIN (niced: 2 shared cores),
# then move the command to BIN.
# The directory of MODULE@VERSION ($1) in the Go module cache, downloaded if absent, on stdout.
go_module_dir() {
    GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$1" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

go_install_to() { # BIN PKG@VERSION [LDFLAGS] [TAGS]
    local bin="$1" pkg="$2" ldflags="${3:-}" tags="${4:-}" tmp cmd
    cmd="${pkg%@*}"
    cmd="${cmd##*/}"
    tmp="$CACHE/bin/.$cmd-build.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$tmp" GOFLAGS=-trimpath \
        nice -n "${SCALERL_BUILD_NICE:-10}" go install -ldflags "$ldflags" -tags "$tags" "$pkg" >"$tmp/go.log" 2>&1 \
        || { tail -n 40 "$tmp/go.log" >&2; die "go install of $pkg failed (log above)"; }
    mv "$tmp/$cmd" "$bin"
    rm -rf "$tmp"
}

# wait_proc NAME PIDFILE LOG PATTERN READY_FN T0 TIMEOUT_S POLL_S: poll READY_FN until it succeeds;
# fail early if the process died.
wait_proc() {
    local name="$1" pidfile="$2" logfile="$3" pattern="$4" ready="$5" t0="$6" timeout="$7" poll="$8"
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        # Looked at twice, half a second apart: a read of /proc/PID/cmdline while the server is being
        # exec'd can come back empty, and one such look is not yet a death.
        if ! pid_alive "$(read_pid "$pidfile")" "$pattern" \
            && { sleep 0.5; ! pid_alive "$(read_pid "$pidfile")" "$pattern"; }; then
            tail -n 30 "$logfile" >&2 || true
            die "$name exited during startup; see $logfile"
        fi
        if "$ready" 2>/dev/null; then
            log "$name: ready in $(elapsed "$t0") (pid $(cat "$pidfile"))"
            return 0
        fi
        sleep "$poll"
    done
    tail -n 30 "$logfile" >&2 || true
    die "$name not ready after ${timeout}s; see $logfile"
}

# ---- Kafka ----------------------------------------------------------------------------------------

kafka_pattern() { echo "$STATE/kafka/server.properties"; }

_build_kafka() {
    local home libs tmp t0
    home="$(kafka_home)"
    libs="$home/libs"
    [[ -f "$home/.complete" ]] && return 0
    command -v mvn >/dev/null || die "mvn (Maven) is required to fetch the Kafka jars"
    t0="$(now)"
    log "kafka: fetching Kafka $KAFKA_VERSION jars with Maven into $libs (cold build)"
    tmp="$home.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    local repo=()
    [[ -z "${SCALERL_MAVEN_REPO:-}" ]] || repo=("-Dmaven.repo.local=$SCALERL_MAVEN_REPO")
    mvn -B -q "${repo[@]}" -f "$INFRA_DIR/kafka/pom.xml" "$MAVEN_DEP_PLUGIN:copy-dependencies" \
        -DincludeScope=runtime -DoutputDirectory="$tmp/libs" >"$tmp/mvn.log" 2>&1 \
        || { cat "$tmp/mvn.log" >&2; die "Maven could not fetch the Kafka jars (log above)"; }
    ls "$tmp/libs/kafka_2.13-$KAFKA_VERSION.jar" >/dev/null \
        || die "kafka_2.13-$KAFKA_VERSION.jar missing: is <kafka.version> in kafka/pom.xml $KAFKA_VERSION?"
    rm -rf "$home"
    mv "$tmp" "$home"
    touch "$home/.complete"
    log "kafka: jars fetched in $(elapsed "$t0") ($(du -sh "$libs" | cut -f1))"
}
build_kafka() {
    if [[ -f "$(kafka_home)/.complete" ]]; then
        log "kafka: using cached jars $(kafka_home)/libs"
    else
        with_build_lock kafka _build_kafka
    fi
}

# The SASL_SSL listener's user (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN) and keystore password, made once
# per state dir (kept across restarts: the SCRAM credentials live in the formatted data dir).
kafka_sasl_credentials() {
    local f="$STATE/kafka/sasl"
    if [[ ! -s "$f" ]]; then
        mkdir -p "$STATE/kafka"
        (umask 077 && printf 'KAFKA_SASL_USERNAME=scalerl\nKAFKA_SASL_PASSWORD=%s\nKAFKA_KEYSTORE_PASSWORD=%s\n' \
            "$(python3 -c 'import secrets; print(secrets.token_hex(16))')" \
            "$(python3 -c 'import secrets; print(secrets.token_hex(16))')" >"$f")
    fi
    # shellcheck disable=SC1090
    source "$f"
}

# The host's address, the one Pods of the real node reach it by (the source of its default route).
host_ip() {
    local ip
    ip="$(ip -4 route get 192.0.2.255 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1)"
    [[ -n "$ip" ]] || ip="$(ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -1)"
    [[ -n "$ip" ]] || die "no global IPv4 address on this host"
    echo "$ip"
}

# The names the broker's certificate is valid for: loopback, the host's address (the PODS listener) and
# the names of the Service the real-node tests give it (scalerl-infra/kafka).
kafka_tls_sans() {
    echo "IP:127.0.0.1,DNS:localhost,IP:$(host_ip),DNS:kafka.scalerl-infra.svc,DNS:kafka.scalerl-infra.svc.cluster.local"
}

# A self-signed CA and the broker's certificate for kafka_tls_sans in a PKCS12 keystore (openssl, under a
# second, once per state dir and set of names); clients trust the CA (KAFKA_SSL_CAFILE in build/infra.env).
kafka_tls() {
    local d="$STATE/kafka/tls" sans
    sans="$(kafka_tls_sans)"
    [[ -s "$d/broker.p12" && -s "$d/ca.crt" && "$(cat "$d/sans" 2>/dev/null)" == "$sans" ]] && return 0
    command -v openssl >/dev/null || die "openssl is required for the Kafka TLS listener"
    kafka_sasl_credentials
    rm -rf "$d"
    mkdir -p "$d"
    (
        umask 077
        cd "$d"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt \
            -subj "/CN=scalerl test CA" 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr -subj "/CN=127.0.0.1" 2>/dev/null
        printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$sans" >ext.cnf
        openssl x509 -req -in broker.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
            -extfile ext.cnf -out broker.crt 2>/dev/null
        openssl pkcs12 -export -in broker.crt -inkey broker.key -certfile ca.crt -name broker \
            -out broker.p12 -passout "pass:$KAFKA_KEYSTORE_PASSWORD"
        rm -f broker.csr ext.cnf ca.srl
        chmod 644 ca.crt
        echo "$sans" >sans
    ) || die "kafka: making the TLS keystore with openssl failed"
    log "kafka: made a test CA and broker keystore in $d"
}

write_kafka_config() {
    local port="$1" cport="$2" sport="$3" d="$STATE/kafka" pport hip
    mkdir -p "$d/data"
    kafka_sasl_credentials
    kafka_tls
    # PODS: SASL_SSL on the host's address, for Pods of the real node (scripts/infra/node.sh)
    hip="$(host_ip)"
    pport="$(reuse_or_pick_port "$d/pport")"
    while [[ "$pport" == "$port" || "$pport" == "$cport" || "$pport" == "$sport" ]]; do pport="$(free_port)"; done
    local scram="org.apache.kafka.common.security.scram.ScramLoginModule required;"
    local plain="org.apache.kafka.common.security.plain.PlainLoginModule required"
    plain+=" user_$KAFKA_SASL_USERNAME=\"$KAFKA_SASL_PASSWORD\";"
    (umask 077 && : >"$d/server.properties") # it holds passwords
    cat >"$d/server.properties" <<EOF
# generated by scripts/infra/up.sh: single-node KRaft broker for tests: loopback, and SASL_SSL only on the
# host's address (PODS, for the real node's Pods)
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,CONTROLLER://127.0.0.1:$cport,PODS://$hip:$pport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,PODS://$hip:$pport
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,PODS:SASL_SSL
# SASL_SSL: the SCRAM users are written when the data dir is formatted (StorageTool --add-scram)
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$scram
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=$scram
listener.name.sasl_ssl.plain.sasl.jaas.config=$plain
listener.name.pods.scram-sha-512.sasl.jaas.config=$scram
listener.name.pods.scram-sha-256.sasl.jaas.config=$scram
listener.name.pods.plain.sasl.jaas.config=$plain
ssl.keystore.type=PKCS12
ssl.keystore.location=$d/tls/broker.p12
ssl.keystore.password=$KAFKA_KEYSTORE_PASSWORD
ssl.key.password=$KAFKA_KEYSTORE_PASSWORD
ssl.client.auth=none
log.dirs=$d/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# a restarted broker re-registers only once its previous session expired (fast restarts in tests)
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
auto.create.topics.enable=true
delete.topic.enable=true
# 16 MiB records (rollout groups); topics set their own max.message.bytes too
message.max.bytes=16777216
replica.fetch.max.bytes=16777216
socket.request.max.bytes=104857600
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=168
EOF
    cat >"$d/log4j2.properties" <<'EOF'
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
# WARN keeps the log small and the start fast (INFO logs every partition, every start);
# the few INFO lines below mark the start-up milestones.
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
logger.logmanager.name = kafka.log.LogManager
logger.logmanager.level = INFO
EOF
    echo "$port" >"$d/port"
    echo "$cport" >"$d/cport"
    echo "$sport" >"$d/sport"
    echo "$pport" >"$d/pport"
}

format_kafka_if_needed() {
    local d="$STATE/kafka" libs cid
    libs="$(kafka_home)/libs"
    [[ -f "$d/data/meta.properties" ]] && return 0
    cid="$(java -cp "$libs/*" kafka.tools.StorageTool random-uuid 2>>"$d/kafka.log" | tail -1)"
    [[ -n "$cid" ]] || die "kafka: StorageTool random-uuid failed; see $d/kafka.log"
    kafka_sasl_credentials
    log "kafka: formatting $d/data (cluster id $cid, SCRAM user $KAFKA_SASL_USERNAME)"
    local scram=() m
    for m in SCRAM-SHA-512 SCRAM-SHA-256; do
        scram+=(--add-scram "$m=[name=$KAFKA_SASL_USERNAME,password=$KAFKA_SASL_PASSWORD]")
    done
    java -cp "$libs/*" -Dlog4j2.configurationFile="$d/log4j2.properties" kafka.tools.StorageTool \
        format -t "$cid" -c "$d/server.properties" "${scram[@]}" >>"$d/kafka.log" 2>&1 \
        || die "kafka: StorageTool format failed; see $d/kafka.log"
    touch "$d/data/.scram"
}

# A data dir formatted before the SASL_SSL listener existed has no SCRAM users: add them once through
# the PLAINTEXT listener (the same credentials --add-scram writes at format time).
kafka_scram_users() {
    local d="$STATE/kafka" p
    [[ -f "$d/data/.scram" ]] && return 0
    kafka_sasl_credentials
    p="$KAFKA_SASL_PASSWORD"
    # one mechanism per request: Kafka 4.x refuses to alter one user's credentials twice in one request
    for m in SCRAM-SHA-512 SCRAM-SHA-256; do
        java -cp "$(kafka_home)/libs/*" -Dlog4j2.configurationFile="$d/log4j2.properties" kafka.admin.ConfigCommand \
            --bootstrap-server "127.0.0.1:$(cat "$d/port")" --alter --entity-type users \
            --entity-name "$KAFKA_SASL_USERNAME" --add-config "$m=[password=$p]" \
            >>"$d/kafka.log" 2>&1 || die "kafka: adding the $m user to the existing data dir failed; see $d/kafka.log"
    done
    touch "$d/data/.scram"
    log "kafka: added SCRAM user $KAFKA_SASL_USERNAME to the existing data dir"
}

start_kafka() {
    local d="$STATE/kafka" libs
    libs="$(kafka_home)/libs"
    command -v java >/dev/null || die "java (17+) is required for Kafka"
    format_kafka_if_needed
    # shellcheck disable=SC2086 # KAFKA_JVM_OPTS is a list of flags
    spawn "$d/pid" "$d/kafka.log" java "$KAFKA_HEAP" $KAFKA_JVM_OPTS \
        -Djava.awt.headless=true -Dlog4j2.configurationFile="$d/log4j2.properties" \
        -Dkafka.logs.dir="$d" -cp "$libs/*" kafka.Kafka "$d/server.properties"
}

kafka_ready() {
    python3 "$INFRA_DIR/probe.py" kafka "127.0.0.1:$(cat "$STATE/kafka/port")" --log "$STATE/kafka/kafka.log"
}

# The broker's config has the SASL_SSL listener of this lib.sh (one started by an older up.sh does not).
kafka_has_sasl() { # and the PODS listener on the host's current address, with a certificate for it
    [[ -s "$STATE/kafka/sport" && -s "$STATE/kafka/pport" ]] \
        && grep -q "^listeners=.*SASL_SSL://127.0.0.1:$(cat "$STATE/kafka/sport").*PODS://$(host_ip):$(cat "$STATE/kafka/pport")" \
            "$STATE/kafka/server.properties" 2>/dev/null \
        && [[ "$(cat "$STATE/kafka/tls/sans" 2>/dev/null)" == "$(kafka_tls_sans)" ]]
}

# wait_ready NAME T0 TIMEOUT_S POLL_S: wait_proc for the server in $STATE/NAME (pid, NAME.log).
wait_ready() {
    local d="$STATE/$1"
    wait_proc "$1" "$d/pid" "$d/$1.log" "$("$1_pattern")" "$1_ready" "$2" "$3" "$4"
}

wait_kafka() { wait_ready kafka "$1" "$KAFKA_READY_TIMEOUT" 0.5 && kafka_scram_users; }

# ---- MinIO ----------------------------------------------------------------------------------------

minio_pattern() { echo "$STATE/minio/data"; }

_build_minio() {
    local bin t0
    bin="$(minio_bin)"
    [[ -x "$bin" ]] && return 0
    command -v go >/dev/null || die "go is required to build MinIO"
    t0="$(now)"
    log "minio: building $MINIO_MODULE@$MINIO_VERSION with go install (cold build: minutes on 2 cores)"
    go_install_to "$bin" "$MINIO_MODULE@$MINIO_VERSION"
    log "minio: built in $(elapsed "$t0") ($(du -sh "$bin" | cut -f1))"
}
build_minio() {
    if [[ -x "$(minio_bin)" ]]; then
        log "minio: using cached binary $(minio_bin)"
    else
        with_build_lock minio _build_minio
    fi
}

minio_credentials() {
    local f="$STATE/minio/credentials"
    if [[ ! -s "$f" ]]; then
        mkdir -p "$STATE/minio"
        (umask 077 && printf 'S3_ACCESS_KEY=scalerl\nS3_SECRET_KEY=%s\n' \
            "$(python3 -c 'import secrets; print(secrets.token_hex(16))')" >"$f")
    fi
    # shellcheck disable=SC1090
    source "$f"
}

# On every address (loopback for the tests, the host's for the real node's Pods); the console on loopback.
start_minio() {
    local d="$STATE/minio" port="$1"
    mkdir -p "$d/data"
    echo "$port" >"$d/port"
    minio_credentials
    MINIO_ROOT_USER="$S3_ACCESS_KEY" MINIO_ROOT_PASSWORD="$S3_SECRET_KEY" MINIO_BROWSER=off \
        MINIO_UPDATE=off MINIO_CI_CD=on MINIO_REGION=us-east-1 \
        spawn "$d/pid" "$d/minio.log" "$(minio_bin)" server "$d/data" \
        --address ":$port" --console-address "127.0.0.1:$(free_port)"
}

minio_ready() {
    python3 "$INFRA_DIR/probe.py" minio "http://127.0.0.1:$(cat "$STATE/minio/port")"
}

wait_minio() { wait_ready minio "$1" "$MINIO_READY_TIMEOUT" 0.3; }

# ---- Kubernetes: etcd + kube-apiserver + helm (scripts/infra/k8s.sh) -------------------------------

# shellcheck source=scripts/infra/k8s.sh
source "$INFRA_DIR/k8s.sh"
# The Pod-running cluster beside it: scheduler, controller-manager, kwok (scripts/infra/cluster.sh)
# shellcheck source=scripts/infra/cluster.sh
source "$INFRA_DIR/cluster.sh"
# A real node whose Pods run in containers, with its own API server (scripts/infra/node.sh)
# shellcheck source=scripts/infra/node.sh
source "$INFRA_DIR/node.sh"
# Kueue's controller manager on that cluster (scripts/infra/kueue.sh; not started by default)
# shellcheck source=scripts/infra/kueue.sh
source "$INFRA_DIR/kueue.sh"
# cert-manager's certificate controllers on the plain API server (scripts/infra/certmanager.sh; not started by default)
# shellcheck source=scripts/infra/certmanager.sh
source "$INFRA_DIR/certmanager.sh"

# ---- Prometheus + Jaeger v2 (scripts/infra/observability.sh) --------------------------------------

# shellcheck source=scripts/infra/observability.sh
source "$INFRA_DIR/observability.sh"

# ---- env file -------------------------------------------------------------------------------------

write_env() {
    mkdir -p "$(dirname "$ENV_FILE")"
    local tmp="$ENV_FILE.tmp.$$"
    {
        echo "# written by scripts/infra/up.sh on $(date -Is); sourceable by sh, read by tests/*/conftest.py"
        if [[ -s "$STATE/kafka/port" ]]; then
            cat <<EOF
KAFKA_BOOTSTRAP=127.0.0.1:$(cat "$STATE/kafka/port")
KAFKA_CONTROLLER_PORT=$(cat "$STATE/kafka/cport")
KAFKA_VERSION=$KAFKA_VERSION
KAFKA_PID=$(read_pid "$STATE/kafka/pid")
KAFKA_LOG=$STATE/kafka/kafka.log
KAFKA_DATA=$STATE/kafka/data
EOF
            if kafka_has_sasl; then
                kafka_sasl_credentials
                cat <<EOF
KAFKA_SASL_BOOTSTRAP=127.0.0.1:$(cat "$STATE/kafka/sport")
KAFKA_PODS_BOOTSTRAP=$(host_ip):$(cat "$STATE/kafka/pport")
KAFKA_SASL_MECHANISM=SCRAM-SHA-512
KAFKA_SASL_USERNAME=$KAFKA_SASL_USERNAME
KAFKA_SASL_PASSWORD=$KAFKA_SASL_PASSWORD
KAFKA_SSL_CAFILE=$STATE/kafka/tls/ca.crt
EOF
            fi
        fi
        if [[ -s "$STATE/minio/port" ]]; then
            minio_credentials
            cat <<EOF
S3_ENDPOINT=http://127.0.0.1:$(cat "$STATE/minio/port")
S3_PODS_ENDPOINT=http://$(host_ip):$(cat "$STATE/minio/port")
S3_ACCESS_KEY=$S3_ACCESS_KEY
S3_SECRET_KEY=$S3_SECRET_KEY
S3_REGION=us-east-1
MINIO_VERSION=$MINIO_VERSION
MINIO_PID=$(read_pid "$STATE/minio/pid")
MINIO_LOG=$STATE/minio/minio.log
MINIO_DATA=$STATE/minio/data
EOF
        fi
        k8s_env_lines
        cluster_env_lines
        node_env_lines
        kueue_env_lines
        certmanager_env_lines
        observability_env_lines
    } >"$tmp"
    chmod 600 "$tmp"
    mv "$tmp" "$ENV_FILE"
}
