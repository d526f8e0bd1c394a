# shellcheck shell=bash
# cert-manager's certificate controllers against the test API server (k8s.sh). Sourced by lib.sh (up.sh
# certmanager / down.sh certmanager), or run on its own:
#   scripts/infra/certmanager.sh build | up | down | env
#
# What runs: our own main (scripts/infra/certmanager/main.go) over the library packages of
# github.com/cert-manager/cert-manager@$CERTMANAGER_VERSION: the Certificate, CertificateRequest and
# approver controllers and the self-signed and CA issuers, the machinery the operator's cert-manager mode
# uses (a self-signed CA per RLJob; operators/scalerl_operator/control/rpc_certmanager.py). The project's
# own controller binary is a module of its own (`controller-binary`) that the Go module proxy does not serve.
# Left out: ACME, Vault, Venafi, the Ingress/Gateway shims, leader election, the webhook (so Certificates
# are not defaulted or validated by it: the operator writes them complete) and the cainjector.
# The CRDs are those of the module (deploy/crds), copied into the cache at build time and server-side
# applied at start: no network at test time. They go on the plain API server only (not on the Pod-running
# cluster), where they stay for the life of its etcd.
#
# Build (warm module cache, niced, 2 cores): about 2 min; 65 MB binary. Cached after, under a name that
# carries main.go's hash, so a changed main.go is built again.
#
# Layout
#   cache:  bin/cert-manager-controller-<version>-<main.go hash>   share/cert-manager-<version>/crds/*.yaml
#   state:  build/infra/certmanager/{certmanager.log,pid,readyz-port,kubeconfig-path}

CERTMANAGER_MODULE="github.com/cert-manager/cert-manager"
CERTMANAGER_VERSION="${SCALERL_CERTMANAGER_VERSION:-v1.21.2}"
CERTMANAGER_STATE="$STATE/certmanager"
CERTMANAGER_READY_TIMEOUT="${SCALERL_CERTMANAGER_READY_TIMEOUT:-60}"
CERTMANAGER_NAMESPACE="cert-manager" # where ClusterIssuers' Secrets are read from
CERTMANAGER_MAIN="$INFRA_DIR/certmanager/main.go"

certmanager_bin() { echo "$CACHE/bin/cert-manager-controller-$CERTMANAGER_VERSION-$(sha256sum "$CERTMANAGER_MAIN" | cut -c1-12)"; }
certmanager_crds() { echo "$CACHE/share/cert-manager-$CERTMANAGER_VERSION/crds"; }
certmanager_pattern() { echo "cert-manager-controller-$CERTMANAGER_VERSION"; }

_build_certmanager() {
    local bin dir t0 src
    bin="$(certmanager_bin)"
    [[ -x "$bin" && -d "$(certmanager_crds)" ]] && return 0
    command -v go >/dev/null || die "go is required to build cert-manager"
    t0="$(now)"
    mkdir -p "$CACHE/bin"
    if [[ ! -x "$bin" ]]; then
        dir="$CACHE/src/cert-manager-$CERTMANAGER_VERSION"
        log "cert-manager: building its controllers from $CERTMANAGER_MODULE@$CERTMANAGER_VERSION in $dir"
        rm -rf "$dir"
        mkdir -p "$dir"
        cp "$CERTMANAGER_MAIN" "$dir/main.go"
        (cd "$dir" && GOTOOLCHAIN=local go mod init scalerl.local/cert-manager-build >build.log 2>&1 \
            && GOTOOLCHAIN=local GOFLAGS=-mod=mod go get "$CERTMANAGER_MODULE@$CERTMANAGER_VERSION" >>build.log 2>&1 \
            && GOTOOLCHAIN=local GOFLAGS=-mod=mod nice -n "${SCALERL_BUILD_NICE:-10}" go mod tidy >>build.log 2>&1) \
            || { tail -n 40 "$dir/build.log" >&2; die "could not resolve $CERTMANAGER_MODULE@$CERTMANAGER_VERSION"; }
        _go_build_in "$dir" "$bin" . "-s -w"
    fi
    src="$(go_module_dir "$CERTMANAGER_MODULE@$CERTMANAGER_VERSION")" \
        || die "could not locate $CERTMANAGER_MODULE@$CERTMANAGER_VERSION in the module cache"
    [[ -d "$src/deploy/crds" ]] || die "cert-manager $CERTMANAGER_VERSION has no deploy/crds"
    replace_dir "$(certmanager_crds)" "$src"/deploy/crds/cert-manager.io_*.yaml
    log "cert-manager: built, CRDs copied in $(elapsed "$t0") ($(du -sh "$bin" | cut -f1))"
}

build_certmanager() {
    if [[ -x "$(certmanager_bin)" && -d "$(certmanager_crds)" ]]; then
        log "cert-manager: using cached binary $(certmanager_bin)"
    else
        with_build_lock certmanager _build_certmanager
    fi
}

certmanager_kubeconfig() {
    [[ -s "$K8S_STATE/kubeconfig" ]] && k8s_running || die "cert-manager needs the API server (up.sh k8s)"
    echo "$K8S_STATE/kubeconfig"
}

certmanager_ready() {
    [[ "$(curl -fsS --max-time 3 "http://127.0.0.1:$(cat "$CERTMANAGER_STATE/readyz-port")/readyz" 2>/dev/null)" == "ok" ]]
}

up_certmanager() {
    local pid t0 kc port
    mkdir -p "$CERTMANAGER_STATE"
    pid="$(read_pid "$CERTMANAGER_STATE/pid")"
    if pid_alive "$pid" "$(certmanager_pattern)" && certmanager_ready; then
        log "cert-manager: already running and healthy (pid $pid)"
        return 0
    fi
    stop_pid "$pid" "$(certmanager_pattern)" cert-manager
    t0="$(now)"
    kc="$(certmanager_kubeconfig)"
    python3 "$INFRA_DIR/crd_api.py" crds "$kc" "$(certmanager_crds)"/*.yaml || die "cert-manager: installing the CRDs failed"
    python3 "$INFRA_DIR/crd_api.py" namespace "$kc" "$CERTMANAGER_NAMESPACE" || die "cert-manager: namespace failed"
    port="$(free_port)"
    echo "$port" >"$CERTMANAGER_STATE/readyz-port"
    echo "$kc" >"$CERTMANAGER_STATE/kubeconfig-path"
    log "cert-manager: starting $CERTMANAGER_VERSION against $(python3 "$INFRA_DIR/crd_api.py" server "$kc"), log $CERTMANAGER_STATE/certmanager.log"
    spawn "$CERTMANAGER_STATE/pid" "$CERTMANAGER_STATE/certmanager.log" "$(certmanager_bin)" --kubeconfig "$kc" \
        --cluster-resource-namespace "$CERTMANAGER_NAMESPACE" --readyz-address "127.0.0.1:$port"
    wait_ready certmanager "$t0" "$CERTMANAGER_READY_TIMEOUT" 0.3
}

down_certmanager() {
    stop_pid "$(read_pid "$CERTMANAGER_STATE/pid")" "$(certmanager_pattern)" cert-manager
    rm -f "$CERTMANAGER_STATE/pid"
}

# Lines for build/infra.env (only while the controller runs).
certmanager_env_lines() {
    pid_alive "$(read_pid "$CERTMANAGER_STATE/pid")" "$(certmanager_pattern)" || return 0
    cat <<EOT
CERTMANAGER_VERSION=$CERTMANAGER_VERSION
CERTMANAGER_PID=$(read_pid "$CERTMANAGER_STATE/pid")
CERTMANAGER_LOG=$CERTMANAGER_STATE/certmanager.log
CERTMANAGER_KUBECONFIG=$(cat "$CERTMANAGER_STATE/kubeconfig-path")
EOT
}

# Run on its own: build | up | down | env (lib.sh sources this file again; the guard stops the loop).
if [[ "${BASH_SOURCE[0]}" == "$0" && -z "${_SCALERL_CERTMANAGER_MAIN:-}" ]]; then
    _SCALERL_CERTMANAGER_MAIN=1
    # shellcheck source=scripts/infra/lib.sh
    source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
    run_component certmanager "${1:-}"
fi
