# shellcheck shell=bash
# The Pod-running test cluster, beside the bare API server of k8s.sh: a second kube-apiserver on the
# same etcd (its own --etcd-prefix, so nothing is shared but the process), kube-scheduler,
# kube-controller-manager and kwok faking the kubelets of three Nodes (two with 8 GPUs each, one
# CPU-only). Sourced by lib.sh after k8s.sh, never run.
#
# Why a second API server: the tests of the bare one fake readiness by patching Deployment status and
# expect nothing to be scheduled or collected; a controller-manager on that server would overwrite
# their status patches. Here the controllers, not the tests, own every status.
#
# Layout
#   cache:  bin/kube-scheduler-<k8s version>  bin/kube-controller-manager-<k8s version>   (k8s.sh builds
#           them in the kube-apiserver's wrapper module)   bin/kwok-<kwok version>
#           share/kwok-<kwok version>/stages/*.yaml   the kwok module's own stages, copied at build
#   state:  build/infra/k8s/cluster/{kubeconfig,kwok.yaml,nodes.json,port,{apiserver,scheduler,
#           controller-manager,kwok}.{pid,log},{scheduler,controller-manager}-port,*-certs/}

KWOK_MODULE="sigs.k8s.io/kwok"
# kwok v0.8.0 needs go >= 1.26; an older toolchain gets v0.7.0 (same stage files).
if [[ -z "${SCALERL_KWOK_VERSION:-}" ]] && command -v go >/dev/null \
    && [[ "$(go env GOVERSION 2>/dev/null)" =~ ^go1\.([0-9]+) ]] && ((BASH_REMATCH[1] < 26)); then
    KWOK_VERSION="v0.7.0"
else
    KWOK_VERSION="${SCALERL_KWOK_VERSION:-v0.8.0}"
fi
CLUSTER_STATE="$K8S_STATE/cluster"
CLUSTER_ETCD_PREFIX="/scalerl-cluster"
CLUSTER_READY_TIMEOUT="${SCALERL_CLUSTER_READY_TIMEOUT:-120}"
# Taint-based eviction: pods tolerate a NotReady/unreachable node this long (the API server's
# DefaultTolerationSeconds; 300 s in a real cluster), and a node whose lease is older than the grace
# period is NotReady (40-50 s in a real cluster). Short here so a node failure plays out in seconds.
CLUSTER_TOLERATION_S="${SCALERL_CLUSTER_TOLERATION_S:-2}"
CLUSTER_NODE_GRACE_S="${SCALERL_CLUSTER_NODE_GRACE_S:-20}"
KWOK_LEASE_S=8 # kwok renews every lease/4 = 2 s; well inside the grace period
# The kwok stages of the module (kustomize/stage/...): nodes become Ready and heartbeat with a lease;
# pods become Ready at once, Job pods complete, deleted pods go; a node labelled
# node-not-ready.stage.kwok.x-k8s.io=true reports Ready=False.
KWOK_STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
    node/chaos/node-not-ready.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)
# Stages of our own, in the checkout: a pod annotated scalerl.test/container-restarts=<n> reports its
# first container restarted n times (kwok has no such stage; tests/k8s/test_cluster_operator.py).
KWOK_OWN_STAGES=("$INFRA_DIR/kwok/pod-container-restart.yaml")
KWOK_NODE_ANNOTATION="kwok.x-k8s.io/node=fake"
# The controllers a GPU job's life touches (the rest of '*' is off: less CPU on a small machine).
CLUSTER_CONTROLLERS="deployment-controller,replicaset-controller,statefulset-controller,job-controller,\
garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,\
root-ca-certificate-publisher-controller,node-lifecycle-controller,taint-eviction-controller,\
pod-garbage-collector-controller,endpointslice-controller,disruption-controller"

kube_scheduler_bin() { echo "$CACHE/bin/kube-scheduler-$K8S_VERSION"; }
kube_controller_manager_bin() { echo "$CACHE/bin/kube-controller-manager-$K8S_VERSION"; }
kwok_bin() { echo "$CACHE/bin/kwok-$KWOK_VERSION"; }
kwok_stages() { echo "$CACHE/share/kwok-$KWOK_VERSION/stages"; }

_build_kwok() {
    local bin t0 src s
    bin="$(kwok_bin)"
    [[ -x "$bin" && -d "$(kwok_stages)" ]] && return 0
    command -v go >/dev/null || die "go is required to build kwok"
    t0="$(now)"
    if [[ ! -x "$bin" ]]; then
        log "kwok: building $KWOK_MODULE/cmd/kwok@$KWOK_VERSION with go install"
        go_install_to "$bin" "$KWOK_MODULE/cmd/kwok@$KWOK_VERSION" "-s -w"
    fi
    src="$(go_module_dir "$KWOK_MODULE@$KWOK_VERSION")" \
        || die "could not locate $KWOK_MODULE@$KWOK_VERSION in the module cache"
    mkdir -p "$(kwok_stages).tmp.$$"
    for s in "${KWOK_STAGES[@]}"; do
        cp "$src/kustomize/stage/$s" "$(kwok_stages).tmp.$$/" || die "kwok $KWOK_VERSION lacks stage $s"
    done
    rm -rf "$(kwok_stages)"
    mv "$(kwok_stages).tmp.$$" "$(kwok_stages)"
    log "kwok: built, stages copied in $(elapsed "$t0") ($(du -sh "$bin" | cut -f1))"
}

# The cluster's binaries: kube-scheduler + kube-controller-manager (in the API server's wrapper module)
# and kwok (its own module); up.sh builds the two in different lanes.
build_cluster_kube() {
    if [[ -x "$(kube_scheduler_bin)" && -x "$(kube_controller_manager_bin)" ]]; then
        log "kube-scheduler, kube-controller-manager: using cached binaries in $CACHE/bin"
    else
        with_build_lock kube _build_kube kube-scheduler kube-controller-manager
    fi
}
build_kwok() {
    if [[ -x "$(kwok_bin)" && -d "$(kwok_stages)" ]]; then
        log "kwok: using cached binary $(kwok_bin)"
    else
        with_build_lock kwok _build_kwok
    fi
}

# ---- processes ----------------------------------------------------------------------------------------

cluster_apiserver_pattern() { echo "--etcd-prefix=$CLUSTER_ETCD_PREFIX"; }
cluster_scheduler_pattern() { echo "$CLUSTER_STATE/scheduler-certs"; }
cluster_controller_manager_pattern() { echo "$CLUSTER_STATE/controller-manager-certs"; }
cluster_kwok_pattern() { echo "$CLUSTER_STATE/kwok.yaml"; }
CLUSTER_PARTS=(kwok controller-manager scheduler apiserver) # stop order

cluster_api() { echo "https://127.0.0.1:$(cat "$CLUSTER_STATE/port")"; }

cluster_get() { # PATH: GET on the cluster API server with the admin token
    curl -fsS --max-time 3 --cacert "$K8S_STATE/certs/ca.crt" -H "Authorization: Bearer $(k8s_token)" \
        "$(cluster_api)$1"
}

cluster_apiserver_ready() { [[ "$(cluster_get /readyz 2>/dev/null)" == "ok" ]]; }

_healthz() { [[ "$(curl -fsSk --max-time 3 "https://127.0.0.1:$(cat "$CLUSTER_STATE/$1-port")/healthz" \
    2>/dev/null)" == "ok" ]]; }
cluster_scheduler_ready() { _healthz scheduler; }
cluster_controller_manager_ready() { _healthz controller-manager; }

# kwok is ready when every fake Node reports Ready=True (its node-initialize stage ran).
cluster_kwok_ready() {
    cluster_get "/api/v1/nodes?labelSelector=scalerl.dev/fake-node" | python3 -c '
import json, sys
nodes = json.load(sys.stdin)["items"]
ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))]
sys.exit(0 if nodes and len(ready) == len(nodes) else 1)'
}

_cluster_wait() { # PART T0
    local p="$1"
    wait_proc "cluster $p" "$CLUSTER_STATE/$p.pid" "$CLUSTER_STATE/$p.log" "$("cluster_${p//-/_}_pattern")" \
        "cluster_${p//-/_}_ready" "$2" "$CLUSTER_READY_TIMEOUT" 0.3
}

start_cluster_apiserver() {
    local port="$1" c="$K8S_STATE/certs"
    echo "$port" >"$CLUSTER_STATE/port"
    # As k8s.sh's, plus the ServiceAccount admission plugin (pods get their service account's token)
    # and short default tolerations of NotReady/unreachable nodes.
    spawn "$CLUSTER_STATE/apiserver.pid" "$CLUSTER_STATE/apiserver.log" "$(kube_apiserver_bin)" \
        --etcd-servers "http://127.0.0.1:$(cat "$K8S_STATE/etcd-port")" "$(cluster_apiserver_pattern)" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
        --cert-dir "$CLUSTER_STATE/apiserver-certs" --tls-cert-file "$c/serving.crt" \
        --tls-private-key-file "$c/serving.key" --client-ca-file "$c/ca.crt" \
        --token-auth-file "$K8S_STATE/tokens.csv" --service-cluster-ip-range 10.0.1.0/24 \
        --allow-privileged=true --authorization-mode RBAC \
        --service-account-issuer "https://127.0.0.1:$port" --service-account-key-file "$c/sa.pub" \
        --service-account-signing-key-file "$c/sa.key" \
        --default-not-ready-toleration-seconds "$CLUSTER_TOLERATION_S" \
        --default-unreachable-toleration-seconds "$CLUSTER_TOLERATION_S" \
        --enable-priority-and-fairness=false --profiling=false --v=1
}

write_cluster_kubeconfig() {
    sed "s#server: https://127.0.0.1:[0-9]*#server: $(cluster_api)#; s#the test kube-apiserver#the Pod-running test cluster#" \
        "$K8S_STATE/kubeconfig" >"$CLUSTER_STATE/kubeconfig.tmp.$$"
    chmod 600 "$CLUSTER_STATE/kubeconfig.tmp.$$"
    mv "$CLUSTER_STATE/kubeconfig.tmp.$$" "$CLUSTER_STATE/kubeconfig"
}

# Common flags of the scheduler and the controller-manager of a cluster whose state is DIR (its
# kubeconfig there; node.sh's cluster too): the admin kubeconfig for everything, no leader election (one
# of each), /healthz over HTTPS on a free loopback port.
_component_flags() { # DIR PART PORT
    local d="$1" k="$1/kubeconfig"
    echo "$3" >"$d/$2-port"
    printf '%s\n' --kubeconfig "$k" --authentication-kubeconfig "$k" --authorization-kubeconfig "$k" \
        --authentication-skip-lookup --leader-elect=false --bind-address 127.0.0.1 --secure-port "$3" --cert-dir "$d/$2-certs" \
        --profiling=false --v=1
}

# start_scheduler DIR PORT: the kube-scheduler of the cluster whose state is DIR (node.sh's too)
start_scheduler() {
    local flags
    mapfile -t flags < <(_component_flags "$1" scheduler "$2")
    spawn "$1/scheduler.pid" "$1/scheduler.log" "$(kube_scheduler_bin)" "${flags[@]}"
}

start_cluster_controller_manager() {
    local flags c="$K8S_STATE/certs"
    mapfile -t flags < <(_component_flags "$CLUSTER_STATE" controller-manager "$1")
    spawn "$CLUSTER_STATE/controller-manager.pid" "$CLUSTER_STATE/controller-manager.log" \
        "$(kube_controller_manager_bin)" "${flags[@]}" --controllers "$CLUSTER_CONTROLLERS" \
        --service-account-private-key-file "$c/sa.key" --root-ca-file "$c/ca.crt" \
        --use-service-account-credentials=false --node-monitor-period 1s \
        --node-monitor-grace-period "${CLUSTER_NODE_GRACE_S}s" --concurrent-gc-syncs 5
}

kwok_config() { # the config kwok loads, on stdout
    local s
    # Stages only: a KwokConfiguration here would replace kwok's defaults (its options are flags below).
    echo "# written by scripts/infra/up.sh: the stages of $KWOK_MODULE@$KWOK_VERSION and scripts/infra/kwok/"
    for s in "${KWOK_STAGES[@]}"; do
        echo "---"
        cat "$(kwok_stages)/${s##*/}"
    done
    for s in "${KWOK_OWN_STAGES[@]}"; do
        echo "---"
        cat "$s"
    done
}

write_kwok_config() {
    local f="$CLUSTER_STATE/kwok.yaml"
    kwok_config >"$f.tmp.$$"
    mv "$f.tmp.$$" "$f"
}

# True when the running kwok loaded the stages this checkout would give it (kwok reads them at start).
kwok_config_current() { [[ "$(kwok_config)" == "$(cat "$CLUSTER_STATE/kwok.yaml" 2>/dev/null)" ]]; }

start_cluster_kwok() {
    write_kwok_config
    spawn "$CLUSTER_STATE/kwok.pid" "$CLUSTER_STATE/kwok.log" "$(kwok_bin)" \
        --kubeconfig "$CLUSTER_STATE/kubeconfig" --config "$CLUSTER_STATE/kwok.yaml" \
        --manage-all-nodes=false --manage-nodes-with-annotation-selector "$KWOK_NODE_ANNOTATION" \
        --node-lease-duration-seconds "$KWOK_LEASE_S" --cidr 10.244.0.0/16 --node-ip 10.200.0.1
}

# The fake Nodes, applied server-side (their status carries capacity: kwok keeps it). GPU nodes
# carry what the NVIDIA GPU operator's feature discovery labels and the usual taint.
apply_cluster_nodes() {
    python3 "$INFRA_DIR/fake_nodes.py" "${KWOK_NODE_ANNOTATION%%=*}" "${KWOK_NODE_ANNOTATION#*=}" \
        >"$CLUSTER_STATE/nodes.json"
    python3 - "$(cluster_api)" "$K8S_STATE/certs/ca.crt" "$(k8s_token)" "$CLUSTER_STATE/nodes.json" <<'PY' \
        || die "could not create the fake Nodes (see above)"
import json, ssl, sys, urllib.request
api, ca, token, path = sys.argv[1:]
ctx = ssl.create_default_context(cafile=ca)
for node in json.load(open(path)):
    name = node["metadata"]["name"]
    for sub in ("", "/status"):  # the status subresource keeps capacity and allocatable on updates
        req = urllib.request.Request(f"{api}/api/v1/nodes/{name}{sub}?fieldManager=scalerl-infra&force=true",
                                     data=json.dumps(node).encode(), method="PATCH",
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/apply-patch+yaml"})
        urllib.request.urlopen(req, context=ctx, timeout=10).read()
PY
}

# up_cluster: start what is not running healthy (after up_k8s: it needs etcd and the certificates).
up_cluster() {
    local p t0 pid port healthy=1
    mkdir -p "$CLUSTER_STATE"
    for p in apiserver scheduler controller-manager kwok; do
        pid="$(read_pid "$CLUSTER_STATE/$p.pid")"
        if ! pid_alive "$pid" "$("cluster_${p//-/_}_pattern")" || ! "cluster_${p//-/_}_ready" 2>/dev/null; then
            healthy=0
            break
        fi
    done
    if ((healthy)); then
        log "cluster: already running and healthy on $(cluster_api)"
        write_cluster_kubeconfig
        if ! kwok_config_current; then # new stages: restart kwok alone (the pods and nodes stay)
            t0="$(now)"
            log "cluster: kwok's stages changed; restarting kwok"
            stop_pid "$(read_pid "$CLUSTER_STATE/kwok.pid")" "$(cluster_kwok_pattern)" "cluster kwok"
            start_cluster_kwok
            _cluster_wait kwok "$t0"
        fi
        return 0
    fi
    down_cluster
    t0="$(now)"
    port="$(reuse_or_pick_port "$CLUSTER_STATE/port")"
    log "cluster: starting its kube-apiserver on https://127.0.0.1:$port, log $CLUSTER_STATE/apiserver.log"
    start_cluster_apiserver "$port"
    write_cluster_kubeconfig
    _cluster_wait apiserver "$t0"
    t0="$(now)"
    port="$(reuse_or_pick_port "$CLUSTER_STATE/scheduler-port")"
    start_scheduler "$CLUSTER_STATE" "$port"
    local cm_port
    cm_port="$(reuse_or_pick_port "$CLUSTER_STATE/controller-manager-port")"
    [[ "$cm_port" != "$port" ]] || cm_port="$(free_port)"
    start_cluster_controller_manager "$cm_port"
    apply_cluster_nodes
    start_cluster_kwok
    for p in scheduler controller-manager kwok; do _cluster_wait "$p" "$t0"; done
    log "cluster: scheduler, controller-manager and kwok ($(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$CLUSTER_STATE/nodes.json") fake nodes) up in $(elapsed "$t0")"
}

down_cluster() {
    local p
    for p in "${CLUSTER_PARTS[@]}"; do
        stop_pid "$(read_pid "$CLUSTER_STATE/$p.pid")" "$("cluster_${p//-/_}_pattern")" "cluster $p"
        rm -f "$CLUSTER_STATE/$p.pid"
    done
}

cluster_running() {
    pid_alive "$(read_pid "$CLUSTER_STATE/apiserver.pid")" "$(cluster_apiserver_pattern)" \
        && [[ -s "$CLUSTER_STATE/kubeconfig" ]]
}

# Lines for build/infra.env (only while the cluster's API server runs).
cluster_env_lines() {
    cluster_running || return 0
    cat <<EOF
CLUSTER_KUBECONFIG=$CLUSTER_STATE/kubeconfig
CLUSTER_API=$(cluster_api)
CLUSTER_PID=$(read_pid "$CLUSTER_STATE/apiserver.pid")
CLUSTER_LOG_DIR=$CLUSTER_STATE
KWOK_VERSION=$KWOK_VERSION
CLUSTER_NODES=$CLUSTER_STATE/nodes.json
EOF
}
