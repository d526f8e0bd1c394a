# shellcheck shell=bash
# Kueue's controller manager against the Pod-running test cluster (cluster.sh). Sourced by lib.sh (up.sh
# kueue / down.sh kueue), or run on its own, which writes no build/infra.env (the tests' fixture does
# this: tests/k8s/conftest.py):
#   scripts/infra/kueue.sh build | up | down | env
#
# What runs: `sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION` (go install; its go.mod has no replace
# directives), with a Configuration of our own (state dir, config.yaml):
#   - leader election off; the visibility API server off (feature gate VisibilityOnDemand=false: it is
#     an aggregated API server we do not register);
#   - integrations: batch/job (a built-in one must be named; Jobs without the queue label are left
#     alone) and the external framework RLJob.v1alpha1.scalerl.dev: the scalerl operator creates and
#     owns the Workload of each queued RLJob (operators/scalerl_operator/control/kueue.py);
#   - webhooks: NOT registered. Kueue's manager serves them (on a loopback port, with a self-signed
#     certificate made here), but no Validating/MutatingWebhookConfiguration is created and the CRDs keep
#     conversion strategy None: the API servers are shared by other tests. So Workloads, ClusterQueues,
#     LocalQueues and ResourceFlavors are neither defaulted nor validated by Kueue's webhooks; every
#     client (the operator, the tests) writes them complete, in kueue.x-k8s.io/v1beta2 (the storage
#     version; no conversion is ever needed);
#   - internal certificate management off: it would wait for the webhook configurations to inject CA
#     bundles into. With it off, Kueue reads its metrics certificate from the fixed path
#     /etc/kueue/metrics/certs; the manager runs in a private mount namespace (unshare -m, needs root)
#     where this instance's certificate directory is bind-mounted there.
# The CRDs are those of the module (config/components/crd/bases), copied into the cache at build time and
# server-side applied at start: no network at test time.
#
# Cold build (go install, niced, module cache cold for Kueue's own dependencies): 23 min wall on this
# project's 2 shared cores under a load average of 6-9 (9.7 min user CPU); 84 MB binary. Cached after.
#
# Layout
#   cache:  bin/kueue-<version>   share/kueue-<version>/crds/*.yaml
#   state:  build/infra/kueue/{config.yaml,kueue.log,pid,health-port,certs/}

KUEUE_MODULE="sigs.k8s.io/kueue"
KUEUE_VERSION="${SCALERL_KUEUE_VERSION:-v0.17.0}"
KUEUE_STATE="$STATE/kueue"
KUEUE_READY_TIMEOUT="${SCALERL_KUEUE_READY_TIMEOUT:-90}"
KUEUE_NAMESPACE="kueue-system"
KUEUE_METRICS_CERTS="/etc/kueue/metrics/certs" # fixed in Kueue's main.go when internal certs are off
KUEUE_EXTERNAL_FRAMEWORK="RLJob.v1alpha1.scalerl.dev" # operators/scalerl_operator/api/spec.py GROUP/VERSION

kueue_bin() { echo "$CACHE/bin/kueue-$KUEUE_VERSION"; }
kueue_crds() { echo "$CACHE/share/kueue-$KUEUE_VERSION/crds"; }
kueue_pattern() { echo "$KUEUE_STATE/config.yaml"; }

_build_kueue() {
    local bin t0 src
    bin="$(kueue_bin)"
    [[ -x "$bin" && -d "$(kueue_crds)" ]] && return 0
    command -v go >/dev/null || die "go is required to build Kueue"
    # v0.17.0's go.mod says go 1.25.0 (the module proxy reachable here serves no older release)
    [[ "$(go env GOVERSION)" =~ ^go1\.([0-9]+) ]] && ((BASH_REMATCH[1] >= 25)) \
        || die "kueue $KUEUE_VERSION needs go >= 1.25 (found $(go env GOVERSION))"
    t0="$(now)"
    mkdir -p "$CACHE/bin"
    if [[ ! -x "$bin" ]]; then
        log "kueue: building $KUEUE_MODULE/cmd/kueue@$KUEUE_VERSION with go install (cold: minutes)"
        go_install_to "$bin" "$KUEUE_MODULE/cmd/kueue@$KUEUE_VERSION" "-s -w"
    fi
    src="$(go_module_dir "$KUEUE_MODULE@$KUEUE_VERSION")" \
        || die "could not locate $KUEUE_MODULE@$KUEUE_VERSION in the module cache"
    [[ -d "$src/config/components/crd/bases" ]] || die "kueue $KUEUE_VERSION has no config/components/crd/bases"
    rm -rf "$(kueue_crds).tmp.$$"
    mkdir -p "$(kueue_crds).tmp.$$"
    cp "$src"/config/components/crd/bases/*.yaml "$(kueue_crds).tmp.$$/"
    rm -rf "$(kueue_crds)"
    mv "$(kueue_crds).tmp.$$" "$(kueue_crds)"
    log "kueue: built, CRDs copied in $(elapsed "$t0") ($(du -sh "$bin" | cut -f1))"
}

build_kueue() {
    if [[ -x "$(kueue_bin)" && -d "$(kueue_crds)" ]]; then
        log "kueue: using cached binary $(kueue_bin)"
    else
        with_build_lock kueue _build_kueue
    fi
}

# The Pod-running cluster's kubeconfig: this checkout's, else the one build/infra.env names.
kueue_kubeconfig() {
    if [[ -s "$CLUSTER_STATE/kubeconfig" ]] && cluster_running; then
        echo "$CLUSTER_STATE/kubeconfig"
    elif [[ -s "${CLUSTER_KUBECONFIG:-}" ]]; then
        echo "$CLUSTER_KUBECONFIG"
    else
        die "kueue needs the Pod-running cluster (up.sh cluster, or CLUSTER_KUBECONFIG)"
    fi
}

kueue_ready() {
    [[ "$(curl -fsS --max-time 3 "http://127.0.0.1:$(cat "$KUEUE_STATE/health-port")/readyz" 2>/dev/null)" == "ok" ]]
}

write_kueue_config() {
    local health="$1" metrics="$2" webhook="$3"
    cat >"$KUEUE_STATE/config.yaml" <<EOF
# generated by scripts/infra/kueue.sh (see its header for what is left out)
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: $KUEUE_NAMESPACE
health:
  healthProbeBindAddress: 127.0.0.1:$health
metrics:
  bindAddress: 127.0.0.1:$metrics
webhook:
  host: 127.0.0.1
  port: $webhook
  certDir: $KUEUE_STATE/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
featureGates:
  VisibilityOnDemand: false
clientConnection:
  qps: 50
  burst: 100
integrations:
  frameworks: ["batch/job"]
  externalFrameworks: ["$KUEUE_EXTERNAL_FRAMEWORK"]
EOF
}

start_kueue() {
    local kc health metrics webhook
    kc="$(kueue_kubeconfig)"
    [[ "$(id -u)" == 0 ]] || die "kueue: the manager's metrics certificate path $KUEUE_METRICS_CERTS is bind-mounted" \
        "in a private mount namespace, which needs root"
    mkdir -p "$KUEUE_STATE/certs" "$KUEUE_METRICS_CERTS"
    python3 "$INFRA_DIR/crd_api.py" crds "$kc" "$(kueue_crds)"/*.yaml || die "kueue: installing the CRDs failed"
    python3 "$INFRA_DIR/crd_api.py" namespace "$kc" "$KUEUE_NAMESPACE" || die "kueue: namespace failed"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=kueue-webhook-service.$KUEUE_NAMESPACE.svc" \
        -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$KUEUE_STATE/certs/tls.key" \
        -out "$KUEUE_STATE/certs/tls.crt" >/dev/null 2>&1 || die "kueue: openssl could not make the test certificate"
    health="$(free_port)"
    metrics="$(free_port)"
    while [[ "$metrics" == "$health" ]]; do metrics="$(free_port)"; done
    webhook="$(free_port)"
    while [[ "$webhook" == "$health" || "$webhook" == "$metrics" ]]; do webhook="$(free_port)"; done
    echo "$health" >"$KUEUE_STATE/health-port"
    echo "$kc" >"$KUEUE_STATE/kubeconfig-path"
    write_kueue_config "$health" "$metrics" "$webhook"
    # shellcheck disable=SC2016
    spawn "$KUEUE_STATE/pid" "$KUEUE_STATE/kueue.log" env KUBECONFIG="$kc" \
        unshare -m --propagation private bash -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' _ \
        "$KUEUE_STATE/certs" "$KUEUE_METRICS_CERTS" "$(kueue_bin)" --config="$KUEUE_STATE/config.yaml"
}

up_kueue() {
    local pid t0
    mkdir -p "$KUEUE_STATE"
    pid="$(read_pid "$KUEUE_STATE/pid")"
    if pid_alive "$pid" "$(kueue_pattern)" && kueue_ready; then
        log "kueue: already running and healthy (pid $pid)"
        return 0
    fi
    stop_pid "$pid" "$(kueue_pattern)" kueue
    t0="$(now)"
    log "kueue: starting $KUEUE_VERSION against $(python3 "$INFRA_DIR/crd_api.py" server "$(kueue_kubeconfig)"), log $KUEUE_STATE/kueue.log"
    start_kueue
    wait_ready kueue "$t0" "$KUEUE_READY_TIMEOUT" 0.5
}

down_kueue() {
    stop_pid "$(read_pid "$KUEUE_STATE/pid")" "$(kueue_pattern)" kueue
    rm -f "$KUEUE_STATE/pid"
}

# Lines for build/infra.env (only while the manager runs).
kueue_env_lines() {
    pid_alive "$(read_pid "$KUEUE_STATE/pid")" "$(kueue_pattern)" || return 0
    cat <<EOF
KUEUE_VERSION=$KUEUE_VERSION
KUEUE_PID=$(read_pid "$KUEUE_STATE/pid")
KUEUE_LOG=$KUEUE_STATE/kueue.log
KUEUE_KUBECONFIG=$(cat "$KUEUE_STATE/kubeconfig-path")
EOF
}

# Run on its own: build | up | down | env (lib.sh sources this file again; the guard stops the loop).
if [[ "${BASH_SOURCE[0]}" == "$0" && -z "${_SCALERL_KUEUE_MAIN:-}" ]]; then
    _SCALERL_KUEUE_MAIN=1
    # shellcheck source=scripts/infra/lib.sh
    source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
    case "${1:-}" in
        build) build_kueue ;;
        up) build_kueue && up_kueue && kueue_env_lines ;;
        down) down_kueue ;;
        env) kueue_env_lines ;;
        *) die "usage: $0 build|up|down|env" ;;
    esac
fi
