# shellcheck shell=bash
# Kubernetes test control plane: etcd + kube-apiserver (envtest-style: no scheduler, no kubelet, no
# controllers), the helm client and grpcurl (what a user points at a role's gRPC endpoint). Sourced by
# lib.sh, never run. The Pod-running cluster beside it
# (scheduler, controller-manager, kwok) is cluster.sh; its two commands build here (_build_kube).
#
# Layout
#   cache:  bin/kube-apiserver-<k8s version>  bin/etcd-<etcd version>  bin/helm-<helm version>
#           bin/grpcurl-<grpcurl version>
#           bin/kube-scheduler-<k8s version>  bin/kube-controller-manager-<k8s version>
#           src/kubernetes-<k8s version>/      the wrapper module of the three Kubernetes commands
#           src/etcd-<etcd version>/           etcd's
#   state:  build/infra/k8s/{certs/,etcd-data/,tokens.csv,kubeconfig,apiserver.log,etcd.log,
#                            apiserver.pid,etcd.pid,port,etcd-port,etcd-peer-port}
#
# kube-apiserver (like kube-scheduler and kube-controller-manager) cannot be `go install`ed
# (k8s.io/kubernetes replaces its staging modules with local paths), so a wrapper module requires k8s.io/kubernetes and gets one `replace k8s.io/<m> =>
# k8s.io/<m> v0.<minor>.<patch>` per staging module, generated from the `=> ./staging/` lines of that
# version's own go.mod. etcd likewise: a three-line main over go.etcd.io/etcd/server/v3/etcdmain.

K8S_VERSION="${SCALERL_K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${SCALERL_ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${SCALERL_HELM_VERSION:-v3.21.4}"
GRPCURL_VERSION="${SCALERL_GRPCURL_VERSION:-v1.9.3}"
K8S_READY_TIMEOUT="${SCALERL_K8S_READY_TIMEOUT:-120}"
K8S_STATE="$STATE/k8s"

kube_apiserver_bin() { echo "$CACHE/bin/kube-apiserver-$K8S_VERSION"; }
etcd_bin() { echo "$CACHE/bin/etcd-$ETCD_VERSION"; }
helm_bin() { echo "$CACHE/bin/helm-$HELM_VERSION"; }
grpcurl_bin() { echo "$CACHE/bin/grpcurl-$GRPCURL_VERSION"; }
k8s_minor() { local m="${K8S_VERSION#v1.}"; echo "${m%%.*}"; } # v1.34.4 -> 34

# _go_build_in DIR OUT PKG LDFLAGS: `go build PKG` inside DIR ($CACHE/src/NAME-VERSION), whose
# go.mod/main were prepared by the caller; logs to build.log there; niced (2 shared cores).
_go_build_in() {
    local dir="$1" out="$2" pkg="$3" ldflags="$4"
    (cd "$dir" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" \
        nice -n "${SCALERL_BUILD_NICE:-10}" go build -trimpath -ldflags "$ldflags" -o "$out.tmp.$$" "$pkg") >>"$dir/build.log" 2>&1 \
        || { tail -n 40 "$dir/build.log" >&2; die "go build of $pkg failed (log above, $dir/build.log)"; }
    mv "$out.tmp.$$" "$out"
}

# The Kubernetes commands built from one wrapper module (one download of k8s.io/kubernetes, one
# `go mod tidy`): the API server here, the scheduler and controller-manager for cluster.sh, the kubelet,
# kube-proxy and the kubectl a user runs for node.sh.
KUBE_CMDS=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy kubectl)

# _kube_wrapper: prepare $CACHE/src/kubernetes-$K8S_VERSION (go.mod with the staging replaces and a
# tools.go importing every command of KUBE_CMDS) unless an earlier build left it complete; echoes it.
_kube_wrapper() {
    local dir staging modfile c
    dir="$CACHE/src/kubernetes-$K8S_VERSION"
    # complete for these commands (an older checkout's module may pin fewer: it is prepared again)
    [[ "$(cat "$dir/.complete" 2>/dev/null)" == "${KUBE_CMDS[*]}" ]] && { echo "$dir"; return 0; }
    staging="v0.${K8S_VERSION#v1.}" # v1.34.4 -> v0.34.4: the staging modules' tag of that release
    rm -rf "$dir"
    mkdir -p "$dir" "$CACHE/bin"
    (cd "$dir" && GOTOOLCHAIN=local go mod init scalerl.local/kubernetes-build >build.log 2>&1 \
        && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
            >download.json 2>>build.log) \
        || { tail -n 20 "$dir/build.log" >&2; die "could not download k8s.io/kubernetes@$K8S_VERSION"; }
    modfile="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["GoMod"])' "$dir/download.json")"
    {
        echo "require k8s.io/kubernetes $K8S_VERSION"
        # every staging module k8s.io/kubernetes replaces with ./staging/src/k8s.io/<m>
        grep -E '=>[[:space:]]*\./staging/' "$modfile" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}' \
            | sort -u
    } >>"$dir/go.mod"
    grep -q '^replace ' "$dir/go.mod" || die "no staging replace lines found in $modfile"
    {
        printf '//go:build tools\n\n// Package tools pins the Kubernetes commands into this wrapper module.\npackage tools\n\nimport (\n'
        for c in "${KUBE_CMDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
        printf ')\n'
    } >"$dir/tools.go"
    (cd "$dir" && GOTOOLCHAIN=local GOFLAGS=-mod=mod nice -n "${SCALERL_BUILD_NICE:-10}" go mod tidy >>build.log 2>&1) \
        || { tail -n 40 "$dir/build.log" >&2; die "go mod tidy of the Kubernetes wrapper module failed"; }
    echo "${KUBE_CMDS[*]}" >"$dir/.complete"
    echo "$dir"
}

# _build_kube CMD...: build the named commands of KUBE_CMDS that are not cached yet, in one `go build`
# (the packages they share compile once), into $CACHE/bin/CMD-$K8S_VERSION.
_build_kube() {
    local dir t0 c missing=() pkgs=() out v="k8s.io/component-base/version"
    for c in "$@"; do [[ -x "$CACHE/bin/$c-$K8S_VERSION" ]] || missing+=("$c"); done
    ((${#missing[@]})) || return 0
    command -v go >/dev/null || die "go is required to build ${missing[*]}"
    t0="$(now)"
    log "${missing[*]}: building from k8s.io/kubernetes@$K8S_VERSION (cold build: many minutes on 2 cores)"
    dir="$(_kube_wrapper)"
    for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    out="$dir/out.$$"
    rm -rf "$out"
    mkdir -p "$out"
    (cd "$dir" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" \
        nice -n "${SCALERL_BUILD_NICE:-10}" go build -trimpath -o "$out/" -ldflags "-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 \
-X $v.gitMinor=$(k8s_minor) -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z" "${pkgs[@]}") \
        >>"$dir/build.log" 2>&1 \
        || { tail -n 40 "$dir/build.log" >&2; die "go build of ${missing[*]} failed (log above, $dir/build.log)"; }
    for c in "${missing[@]}"; do mv "$out/$c" "$CACHE/bin/$c-$K8S_VERSION"; done
    rm -rf "$out"
    log "${missing[*]}: built in $(elapsed "$t0") ($(cd "$CACHE/bin" && du -shc "${missing[@]/%/-$K8S_VERSION}" | tail -1 | cut -f1))"
}
_build_kube_apiserver() { _build_kube kube-apiserver; }

_build_etcd() {
    local bin dir t0
    bin="$(etcd_bin)"
    [[ -x "$bin" ]] && return 0
    command -v go >/dev/null || die "go is required to build etcd"
    t0="$(now)"
    dir="$CACHE/src/etcd-$ETCD_VERSION"
    log "etcd: building go.etcd.io/etcd/server/v3@$ETCD_VERSION in $dir"
    rm -rf "$dir"
    mkdir -p "$dir" "$CACHE/bin"
    cat >"$dir/main.go" <<'EOF'
// Command etcd: the etcd server, built from go.etcd.io/etcd/server/v3 (the etcd module's own main
// cannot be `go install`ed).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    (cd "$dir" && GOTOOLCHAIN=local go mod init scalerl.local/etcd-build >build.log 2>&1 \
        && GOTOOLCHAIN=local GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >>build.log 2>&1 \
        && GOTOOLCHAIN=local GOFLAGS=-mod=mod nice -n "${SCALERL_BUILD_NICE:-10}" go mod tidy >>build.log 2>&1) \
        || { tail -n 40 "$dir/build.log" >&2; die "could not resolve go.etcd.io/etcd/server/v3@$ETCD_VERSION"; }
    _go_build_in "$dir" "$bin" . "-s -w"
    log "etcd: built in $(elapsed "$t0") ($(du -sh "$bin" | cut -f1))"
}

_build_helm() {
    local bin t0 minor
    bin="$(helm_bin)"
    [[ -x "$bin" ]] && return 0
    command -v go >/dev/null || die "go is required to build helm"
    t0="$(now)"
    log "helm: building helm.sh/helm/v3/cmd/helm@$HELM_VERSION with go install"
    # As helm's Makefile does, stamp the Kubernetes version that `helm template` and `helm lint`
    # assume without a cluster (else 1.20): here the test API server's.
    minor="$(k8s_minor)"
    go_install_to "$bin" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
        "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor \
-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
    log "helm: built in $(elapsed "$t0") ($(du -sh "$bin" | cut -f1))"
}

_build_grpcurl() {
    local t0
    [[ -x "$(grpcurl_bin)" ]] && return 0
    command -v go >/dev/null || die "go is required to build grpcurl"
    t0="$(now)"
    log "grpcurl: building github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION with go install"
    go_install_to "$(grpcurl_bin)" "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION" \
        "-s -w -X main.version=$GRPCURL_VERSION"
    log "grpcurl: built in $(elapsed "$t0") ($(du -sh "$(grpcurl_bin)" | cut -f1))"
}

build_k8s() {
    local b
    for b in etcd kube_apiserver helm grpcurl; do
        if [[ -x "$("${b}_bin")" ]]; then
            log "${b//_/-}: using cached binary $("${b}_bin")"
        else
            with_build_lock "${b%_apiserver}" "_build_$b" # kube-apiserver: key kube, as the scheduler's
        fi
    done
}

# ---- certificates, tokens, kubeconfig ---------------------------------------------------------------

# A CA and a serving certificate for 127.0.0.1/localhost, the service-account key pair, and a static
# admin token (system:masters). Made once per state directory and reused across restarts.
k8s_credentials() {
    local c="$K8S_STATE/certs"
    mkdir -p "$c"
    chmod 700 "$c"
    if [[ ! -s "$c/serving.crt" ]]; then
        log "kube-apiserver: generating a CA, a serving certificate and service-account keys in $c"
        (
            cd "$c"
            openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
                -subj "/CN=scalerl-test-ca" >/dev/null 2>&1
            openssl req -newkey rsa:2048 -nodes -keyout serving.key -out serving.csr \
                -subj "/CN=kube-apiserver" >/dev/null 2>&1
            printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' \
                >serving.ext
            openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out serving.crt \
                -days 3650 -extfile serving.ext >/dev/null 2>&1
            openssl genrsa -out sa.key 2048 >/dev/null 2>&1
            openssl rsa -in sa.key -pubout -out sa.pub >/dev/null 2>&1
            chmod 600 ./*.key
        ) || die "openssl could not create the test certificates in $c"
    fi
    if [[ ! -s "$K8S_STATE/tokens.csv" ]]; then
        (umask 077 && printf '%s,scalerl-admin,scalerl-admin,system:masters\n' \
            "$(python3 -c 'import secrets; print(secrets.token_hex(24))')" >"$K8S_STATE/tokens.csv")
    fi
}

k8s_token() { cut -d, -f1 "$K8S_STATE/tokens.csv"; }

write_kubeconfig() {
    local port="$1" tmp="$K8S_STATE/kubeconfig.tmp.$$"
    (umask 077 && cat >"$tmp" <<EOF
# written by scripts/infra/up.sh: the test kube-apiserver on loopback
apiVersion: v1
kind: Config
clusters:
- name: scalerl-test
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $(base64 -w0 <"$K8S_STATE/certs/ca.crt")
users:
- name: scalerl-admin
  user:
    token: $(k8s_token)
contexts:
- name: scalerl-test
  context: {cluster: scalerl-test, user: scalerl-admin, namespace: default}
current-context: scalerl-test
EOF
    )
    mv "$tmp" "$K8S_STATE/kubeconfig"
}

# ---- etcd and kube-apiserver ------------------------------------------------------------------------

etcd_pattern() { echo "$K8S_STATE/etcd-data"; }
k8s_pattern() { echo "$K8S_STATE/certs/serving.crt"; }

start_etcd() {
    local port="$1" peer="$2"
    mkdir -p "$K8S_STATE/etcd-data"
    chmod 700 "$K8S_STATE/etcd-data"
    echo "$port" >"$K8S_STATE/etcd-port"
    echo "$peer" >"$K8S_STATE/etcd-peer-port"
    # --unsafe-no-fsync as envtest: test data need not survive a power cut, and fsyncs are slow here.
    spawn "$K8S_STATE/etcd.pid" "$K8S_STATE/etcd.log" "$(etcd_bin)" --name scalerl-test \
        --data-dir "$K8S_STATE/etcd-data" \
        --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "scalerl-test=http://127.0.0.1:$peer" --unsafe-no-fsync --log-level warn \
        --quota-backend-bytes 2147483648
}

etcd_ready() {
    curl -fsS --max-time 2 "http://127.0.0.1:$(cat "$K8S_STATE/etcd-port")/health" 2>/dev/null \
        | grep -q '"health":"true"'
}

start_kube_apiserver() {
    local port="$1" c="$K8S_STATE/certs"
    echo "$port" >"$K8S_STATE/port"
    # Flags as controller-runtime's envtest sets them, with a static token instead of client certs.
    spawn "$K8S_STATE/apiserver.pid" "$K8S_STATE/apiserver.log" "$(kube_apiserver_bin)" \
        --etcd-servers "http://127.0.0.1:$(cat "$K8S_STATE/etcd-port")" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
        --cert-dir "$c" --tls-cert-file "$c/serving.crt" --tls-private-key-file "$c/serving.key" \
        --client-ca-file "$c/ca.crt" --token-auth-file "$K8S_STATE/tokens.csv" \
        --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true --authorization-mode RBAC \
        --service-account-issuer "https://127.0.0.1:$port" --service-account-key-file "$c/sa.pub" \
        --service-account-signing-key-file "$c/sa.key" --disable-admission-plugins ServiceAccount \
        --enable-priority-and-fairness=false --profiling=false --v=1
}

k8s_ready() {
    [[ "$(curl -fsS --max-time 3 --cacert "$K8S_STATE/certs/ca.crt" -H "Authorization: Bearer $(k8s_token)" \
        "https://127.0.0.1:$(cat "$K8S_STATE/port")/readyz" 2>/dev/null)" == "ok" ]]
}

_up_etcd() {
    local t0 port peer
    t0="$(now)"
    port="$(reuse_or_pick_port "$K8S_STATE/etcd-port")"
    peer="$(reuse_or_pick_port "$K8S_STATE/etcd-peer-port")"
    [[ "$port" != "$peer" ]] || peer="$(free_port)"
    log "etcd: starting on 127.0.0.1:$port, log $K8S_STATE/etcd.log"
    start_etcd "$port" "$peer"
    wait_proc etcd "$K8S_STATE/etcd.pid" "$K8S_STATE/etcd.log" "$(etcd_pattern)" etcd_ready "$t0" \
        "$K8S_READY_TIMEOUT" 0.3
}

# up_k8s: start etcd and kube-apiserver unless both run healthy already; write the kubeconfig.
up_k8s() {
    local t0 pid port
    mkdir -p "$K8S_STATE"
    k8s_credentials
    pid="$(read_pid "$K8S_STATE/apiserver.pid")"
    if pid_alive "$pid" "$(k8s_pattern)" && pid_alive "$(read_pid "$K8S_STATE/etcd.pid")" "$(etcd_pattern)" \
        && k8s_ready; then
        log "kube-apiserver: already running and healthy on https://127.0.0.1:$(cat "$K8S_STATE/port") (pid $pid)"
        write_kubeconfig "$(cat "$K8S_STATE/port")"
        return 0
    fi
    down_k8s
    # A second try on fresh ports and an empty data dir if the first etcd dies or is not ready in time
    # (its log then ends with how it exited); the second failure stops the script.
    if ! (_up_etcd); then
        log "etcd: first start failed (log above); trying again on new ports with an empty data dir"
        stop_pid "$(read_pid "$K8S_STATE/etcd.pid")" "$(etcd_pattern)" etcd  # not ready in time: still running
        rm -rf "$K8S_STATE/etcd-data" "$K8S_STATE/etcd-port" "$K8S_STATE/etcd-peer-port"
        _up_etcd
    fi
    t0="$(now)"
    port="$(reuse_or_pick_port "$K8S_STATE/port")"
    log "kube-apiserver: starting on https://127.0.0.1:$port, log $K8S_STATE/apiserver.log"
    start_kube_apiserver "$port"
    wait_proc kube-apiserver "$K8S_STATE/apiserver.pid" "$K8S_STATE/apiserver.log" "$(k8s_pattern)" k8s_ready \
        "$t0" "$K8S_READY_TIMEOUT" 0.3
    write_kubeconfig "$port"
}

# down_k8s: the API server first (it holds etcd connections), then etcd.
down_k8s() {
    stop_pid "$(read_pid "$K8S_STATE/apiserver.pid")" "$(k8s_pattern)" kube-apiserver
    stop_pid "$(read_pid "$K8S_STATE/etcd.pid")" "$(etcd_pattern)" etcd
    rm -f "$K8S_STATE/apiserver.pid" "$K8S_STATE/etcd.pid"
}

k8s_running() {
    pid_alive "$(read_pid "$K8S_STATE/apiserver.pid")" "$(k8s_pattern)" && [[ -s "$K8S_STATE/kubeconfig" ]]
}

# Lines for build/infra.env (only while the API server runs).
k8s_env_lines() {
    k8s_running || return 0
    cat <<EOF
KUBECONFIG=$K8S_STATE/kubeconfig
K8S_API=https://127.0.0.1:$(cat "$K8S_STATE/port")
K8S_VERSION=$K8S_VERSION
K8S_PID=$(read_pid "$K8S_STATE/apiserver.pid")
K8S_LOG=$K8S_STATE/apiserver.log
ETCD_ENDPOINT=http://127.0.0.1:$(cat "$K8S_STATE/etcd-port")
ETCD_VERSION=$ETCD_VERSION
ETCD_PID=$(read_pid "$K8S_STATE/etcd.pid")
ETCD_LOG=$K8S_STATE/etcd.log
HELM_BIN=$(helm_bin)
HELM_VERSION=$HELM_VERSION
GRPCURL_BIN=$(grpcurl_bin)
EOF
}
