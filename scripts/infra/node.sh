# shellcheck shell=bash
# A real Kubernetes node whose Pods run in real containers, beside the kwok cluster (which stays for the
# scale tests): its own kube-apiserver on k8s.sh's etcd (prefix /scalerl-node), kube-scheduler,
# kube-controller-manager, containerd 1.6 + runc + CNI bridge, a kubelet, kube-proxy (iptables) and
# CoreDNS (cluster DNS, behind the kube-dns Service). The project's image (scripts/image.sh) is imported
# into containerd; the node advertises fake GPUs. Sourced by lib.sh, never run.
#
# Its own API server, not the kwok cluster's: kwok's tests schedule Pods anywhere, and their images do
# not exist here; and Pods must reach the API server, so it listens on the host's address (the kwok
# cluster's stays on loopback).
#
# Host changes, all undone by down_node (node_cleanup.py): sysctls (saved, restored), iptables chains
# (KUBE-*, CNI-*: those that were not there before, with the rules that jump to them), the CNI bridge,
# the mounts under the node's directories and /run/netns, the containers.
#
# Layout
#   cache:  bin/{kubelet,kube-proxy,kubectl}-<k8s version> (k8s.sh's wrapper module), bin/coredns-<v>,
#           containerd/ (its root: the imported images survive a restart), containerd/.imported-<tag>,
#           containerd.oci-import/ (while an import runs: an OCI layout of hard links and the new layers)
#   state:  build/infra/node/{certs/,kubeconfig,apiserver,scheduler,controller-manager,containerd,
#           kubelet,kube-proxy,coredns}.{pid,log}, kubelet/ (root dir), containerd-state/, cni/, host.env

COREDNS_VERSION="${SCALERL_COREDNS_VERSION:-v1.14.7}"
NODE_STATE="$K8S_STATE/node"
NODE_NAME="scalerl-node"
NODE_ETCD_PREFIX="/scalerl-node"
NODE_SERVICE_CIDR="10.0.2.0/24"
NODE_API_SERVICE_IP="10.0.2.1"
NODE_DNS_IP="10.0.2.10"
NODE_POD_CIDR="10.89.0.0/16"
NODE_BRIDGE="scalerl-cni0"
NODE_GPUS="${SCALERL_NODE_GPUS:-4}"
NODE_READY_TIMEOUT="${SCALERL_NODE_READY_TIMEOUT:-180}"
NODE_PAUSE_IMAGE="localhost/scalerl-pause:1"
NODE_SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
    net.ipv4.conf.all.route_localnet)
NODE_CONTROLLERS="deployment-controller,replicaset-controller,statefulset-controller,job-controller,\
garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,\
root-ca-certificate-publisher-controller,node-lifecycle-controller,taint-eviction-controller,\
pod-garbage-collector-controller,endpointslice-controller,endpointslice-mirroring-controller,\
disruption-controller,ttl-after-finished-controller,horizontal-pod-autoscaler-controller"
NODE_PARTS=(coredns kube-proxy kubelet containerd controller-manager scheduler apiserver) # stop order

kubelet_bin() { echo "$CACHE/bin/kubelet-$K8S_VERSION"; }
kube_proxy_bin() { echo "$CACHE/bin/kube-proxy-$K8S_VERSION"; }
kubectl_bin() { echo "$CACHE/bin/kubectl-$K8S_VERSION"; }
coredns_bin() { echo "$CACHE/bin/coredns-$COREDNS_VERSION"; }
containerd_root() { echo "$CACHE/containerd"; }
node_sock() { echo "${NODE_SOCK:-$NODE_STATE/containerd-state/containerd.sock}"; } # NODE_SOCK: preload_node_image's

# The host's address Pods reach it by (the source of its default route), cached for down_node.
node_host_ip() {
    if [[ -s "$NODE_STATE/host-ip" ]]; then cat "$NODE_STATE/host-ip"; return 0; fi
    local ip
    ip="$(host_ip)"
    mkdir -p "$NODE_STATE"
    echo "$ip" >"$NODE_STATE/host-ip"
    echo "$ip"
}

# ---- build --------------------------------------------------------------------------------------------

build_node() {
    local c
    bash "$INFRA_DIR/node_packages.sh" || die "node: the Debian packages it needs are missing"
    for c in containerd runc ctr iptables conntrack ip podman skopeo mmdebstrap gcc; do
        command -v "$c" >/dev/null || die "node: $c is missing (scripts/infra/node_packages.sh installs the Debian packages)"
    done
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] \
        || die "node: the CNI plugins are missing (Debian package containernetworking-plugins)"
    if [[ -x "$(kubelet_bin)" && -x "$(kube_proxy_bin)" && -x "$(kubectl_bin)" ]]; then
        log "kubelet, kube-proxy, kubectl: using cached binaries in $CACHE/bin"
    else
        with_build_lock kube _build_kube kubelet kube-proxy kubectl
    fi
    if [[ -x "$(coredns_bin)" ]]; then
        log "coredns: using cached binary $(coredns_bin)"
    else
        with_build_lock coredns _build_coredns
    fi
}

_build_coredns() {
    local t0
    [[ -x "$(coredns_bin)" ]] && return 0
    t0="$(now)"
    log "coredns: building github.com/coredns/coredns@$COREDNS_VERSION with go install"
    mkdir -p "$CACHE/bin"
    go_install_to "$(coredns_bin)" "github.com/coredns/coredns@$COREDNS_VERSION" "-s -w"
    log "coredns: built in $(elapsed "$t0") ($(du -sh "$(coredns_bin)" | cut -f1))"
}

# ---- certificates and kubeconfig ----------------------------------------------------------------------

# A serving certificate for the node's API server (the host's address, the kubernetes Service's
# ClusterIP and names, loopback) and a client certificate it uses towards the kubelet, both from k8s.sh's
# test CA; made again when the host's address changed.
node_credentials() {
    local c="$NODE_STATE/certs" ca="$K8S_STATE/certs" ip
    ip="$(node_host_ip)"
    mkdir -p "$c"
    chmod 700 "$c"
    [[ -s "$c/serving.crt" && "$(cat "$c/ip" 2>/dev/null)" == "$ip" ]] && return 0
    (
        cd "$c"
        openssl req -newkey rsa:2048 -nodes -keyout serving.key -out serving.csr -subj "/CN=kube-apiserver" \
            >/dev/null 2>&1
        printf 'subjectAltName=IP:%s,IP:127.0.0.1,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
            "$ip" "$NODE_API_SERVICE_IP" >serving.ext
        openssl x509 -req -in serving.csr -CA "$ca/ca.crt" -CAkey "$ca/ca.key" -CAcreateserial \
            -out serving.crt -days 3650 -extfile serving.ext >/dev/null 2>&1
        openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
            -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" >/dev/null 2>&1
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        openssl x509 -req -in kubelet-client.csr -CA "$ca/ca.crt" -CAkey "$ca/ca.key" -CAcreateserial \
            -out kubelet-client.crt -days 3650 -extfile client.ext >/dev/null 2>&1
        chmod 600 ./*.key
        echo "$ip" >ip
    ) || die "node: openssl could not make the node's certificates in $c"
}

node_api() { echo "https://$(node_host_ip):$(cat "$NODE_STATE/port")"; }

write_node_kubeconfig() {
    sed "s#server: https://127.0.0.1:[0-9]*#server: $(node_api)#; s#the test kube-apiserver#the real-node test cluster#" \
        "$K8S_STATE/kubeconfig" >"$NODE_STATE/kubeconfig.tmp.$$"
    chmod 600 "$NODE_STATE/kubeconfig.tmp.$$"
    mv "$NODE_STATE/kubeconfig.tmp.$$" "$NODE_STATE/kubeconfig"
}

node_get() { # PATH: GET on the node's API server with the admin token
    curl -fsS --max-time 3 --cacert "$K8S_STATE/certs/ca.crt" -H "Authorization: Bearer $(k8s_token)" \
        "$(node_api)$1"
}

# ---- processes ----------------------------------------------------------------------------------------

node_apiserver_pattern() { echo "--etcd-prefix=$NODE_ETCD_PREFIX"; }
node_scheduler_pattern() { echo "$NODE_STATE/scheduler-certs"; }
node_controller_manager_pattern() { echo "$NODE_STATE/controller-manager-certs"; }
node_containerd_pattern() { echo "$NODE_STATE/containerd.toml"; }
node_kubelet_pattern() { echo "$NODE_STATE/kubelet.yaml"; }
node_kube_proxy_pattern() { echo "$NODE_STATE/kube-proxy.yaml"; }
node_coredns_pattern() { echo "$NODE_STATE/Corefile"; }

node_apiserver_ready() { [[ "$(node_get /readyz 2>/dev/null)" == "ok" ]]; }
_node_healthz() { [[ "$(curl -fsSk --max-time 3 "https://127.0.0.1:$(cat "$NODE_STATE/$1-port")/healthz" \
    2>/dev/null)" == "ok" ]]; }
node_scheduler_ready() { _node_healthz scheduler; }
node_controller_manager_ready() { _node_healthz controller-manager; }
node_containerd_ready() { ctr --address "$(node_sock)" version >/dev/null 2>&1; }
node_kubelet_ready() { [[ "$(curl -fsS --max-time 3 "http://127.0.0.1:$(cat "$NODE_STATE/kubelet-healthz-port")/healthz" 2>/dev/null)" == "ok" ]]; }
node_kube_proxy_ready() { curl -fsS --max-time 3 "http://127.0.0.1:$(cat "$NODE_STATE/kube-proxy-healthz-port")/healthz" >/dev/null 2>&1; }
node_coredns_ready() { [[ "$(curl -fsS --max-time 3 "http://127.0.0.1:$(cat "$NODE_STATE/coredns-health-port")/health" 2>/dev/null)" == "OK" ]]; }

_node_wait() { # PART T0
    local p="$1" u="${1//-/_}"
    wait_proc "node $p" "$NODE_STATE/$p.pid" "$NODE_STATE/$p.log" "$("node_${u}_pattern")" \
        "node_${u}_ready" "$2" "$NODE_READY_TIMEOUT" 0.3
}

start_node_apiserver() {
    local port="$1" c="$K8S_STATE/certs" n="$NODE_STATE/certs"
    echo "$port" >"$NODE_STATE/port"
    spawn "$NODE_STATE/apiserver.pid" "$NODE_STATE/apiserver.log" "$(kube_apiserver_bin)" \
        --etcd-servers "http://127.0.0.1:$(cat "$K8S_STATE/etcd-port")" "$(node_apiserver_pattern)" \
        --bind-address 0.0.0.0 --advertise-address "$(node_host_ip)" --secure-port "$port" \
        --cert-dir "$NODE_STATE/apiserver-certs" --tls-cert-file "$n/serving.crt" \
        --tls-private-key-file "$n/serving.key" --client-ca-file "$c/ca.crt" \
        --token-auth-file "$K8S_STATE/tokens.csv" --service-cluster-ip-range "$NODE_SERVICE_CIDR" \
        --allow-privileged=true --authorization-mode RBAC \
        --kubelet-client-certificate "$n/kubelet-client.crt" --kubelet-client-key "$n/kubelet-client.key" \
        --kubelet-preferred-address-types InternalIP,Hostname \
        --service-account-issuer "https://kubernetes.default.svc" --service-account-key-file "$c/sa.pub" \
        --service-account-signing-key-file "$c/sa.key" \
        --enable-priority-and-fairness=false --profiling=false --v=1
}

start_node_controller_manager() {
    local flags c="$K8S_STATE/certs"
    mapfile -t flags < <(_component_flags "$NODE_STATE" controller-manager "$1")
    spawn "$NODE_STATE/controller-manager.pid" "$NODE_STATE/controller-manager.log" \
        "$(kube_controller_manager_bin)" "${flags[@]}" --controllers "$NODE_CONTROLLERS" \
        --service-account-private-key-file "$c/sa.key" --root-ca-file "$c/ca.crt" \
        --use-service-account-credentials=false --node-monitor-period 2s --node-monitor-grace-period 40s \
        --horizontal-pod-autoscaler-sync-period 5s
}

write_node_cni() {
    mkdir -p "$NODE_STATE/cni/net.d" "$NODE_STATE/cni/ipam"
    cat >"$NODE_STATE/cni/net.d/10-scalerl.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "scalerl-node",
  "plugins": [
    {"type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$NODE_STATE/cni/ipam",
              "ranges": [[{"subnet": "$NODE_POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
}

# write_containerd_config FILE STATE SOCK CRI: a containerd config on the node's root (in the cache: imported
# images stay), its state under STATE, serving SOCK; CRI "cri" for the node's (the kubelet's runtime), "none"
# for preload_node_image's (imports only).
write_containerd_config() {
    local file=$1 state=$2 sock=$3 cri=$4 off=""
    [[ "$cri" == cri ]] || off='"io.containerd.grpc.v1.cri", '
    cat >"$file" <<EOF
# written by scripts/infra/node.sh: containerd on the real node's root (in the cache: imported images stay)
version = 2
root = "$(containerd_root)"
state = "$state"
disabled_plugins = [${off}"io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
EOF
    [[ "$cri" == cri ]] || return 0
    cat >>"$file" <<EOF
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$NODE_PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  # root here lacks CAP_SYS_RESOURCE: an oom_score_adj below containerd's own (the sandbox's -998) fails
  # runc's nsexec ("can't get final child's PID from pipe: EOF"); clamp it to containerd's instead
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_STATE/cni/net.d"
EOF
}

start_node_containerd() {
    mkdir -p "$NODE_STATE/containerd-state" "$(containerd_root)"
    write_node_cni
    write_containerd_config "$NODE_STATE/containerd.toml" "$NODE_STATE/containerd-state" "$(node_sock)" cri
    spawn "$NODE_STATE/containerd.pid" "$NODE_STATE/containerd.log" containerd --config "$NODE_STATE/containerd.toml"
}

# The sandbox ("pause") image: a static program that waits for a signal, made here (no registry).
node_pause_image() {
    local d="$NODE_STATE/pause"
    ctr --address "$(node_sock)" -n k8s.io images ls -q | grep -qx "$NODE_PAUSE_IMAGE" && return 0
    mkdir -p "$d"
    cat >"$d/pause.c" <<'EOF'
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGINT, done);
    signal(SIGTERM, done);
    for (;;) pause();
}
EOF
    gcc -static -O2 -o "$d/pause" "$d/pause.c" || die "node: could not build the pause program (gcc -static)"
    printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$d/Containerfile"
    podman build -q --format docker -t "$NODE_PAUSE_IMAGE" "$d" >/dev/null \
        || die "node: podman could not build the pause image"
    podman save --format docker-archive "$NODE_PAUSE_IMAGE" \
        | ctr --address "$(node_sock)" -n k8s.io images import - >/dev/null \
        || die "node: could not import the pause image into containerd"
    log "node: pause image $NODE_PAUSE_IMAGE made and imported"
}

# image_stamp TAG: the file beside containerd's root that holds the podman image id last imported as TAG
image_stamp() { echo "$(containerd_root)/.imported-${1//[^A-Za-z0-9._-]/_}"; }

# The project's image (scripts/image.sh) into containerd, unless this very image is there already.
node_import_image() {
    local tag id stamp t0
    tag="$(bash "$REPO_ROOT/scripts/image.sh" --print-tag)"
    if ! podman image exists "$tag"; then
        log "node: $tag is not built yet; building it (scripts/image.sh)"
        bash "$REPO_ROOT/scripts/image.sh" >/dev/null || die "node: the image build failed"
    fi
    id="$(podman image inspect --format '{{.Id}}' "$tag")"
    stamp="$(image_stamp "$tag")"
    if [[ "$(cat "$stamp" 2>/dev/null)" == "$id" ]] \
        && ctr --address "$(node_sock)" -n k8s.io images ls -q | grep -qx "$tag"; then
        log "node: $tag already in containerd"
        return 0
    fi
    t0="$(now)"
    log "node: importing $tag into containerd (the layers it lacks: seconds after a code change, minutes cold)"
    # a try can fail to unpack ("parent snapshot ... does not exist", seen once just after containerd had
    # started, then gone on the next try): tried three times
    local try
    for try in 1 2 3; do
        _node_import_layers "$tag" && break
        ((try < 3)) || die "node: could not import $tag into containerd"
        log "node: import try $try failed; trying again"
        sleep 2
    done
    echo "$id" >"$stamp"
    log "node: $tag imported in $(elapsed "$t0")"
}

# preload_node_image: the project's image into containerd's root (in the cache) as soon as it is built,
# beside the server builds that are still going (up.sh's image lane), by a containerd of its own on that
# root with no CRI plugin; the node's start then finds it there (node_import_image's stamp). Cold, that
# takes the import (about 7 minutes: the cold run of 2026-12-07) off the path to a Ready node. Nothing when
# the stamp already names this image, without root, or while the node's containerd runs on the root
# (up_node imports through it); a failure only logs (up_node imports then).
preload_node_image() {
    local tag id tmp pid rc=0 _
    [[ "$(id -u)" == 0 ]] || return 0
    ! pid_alive "$(read_pid "$NODE_STATE/containerd.pid")" "$(node_containerd_pattern)" || return 0
    tag="$(bash "$REPO_ROOT/scripts/image.sh" --print-tag)"
    id="$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null)" || return 0
    [[ "$(cat "$(image_stamp "$tag")" 2>/dev/null)" != "$id" ]] || return 0
    tmp="$(mktemp -d /tmp/scalerl-preload.XXXXXX)"
    mkdir -p "$(containerd_root)"
    write_containerd_config "$tmp/containerd.toml" "$tmp/state" "$tmp/containerd.sock" none
    containerd --config "$tmp/containerd.toml" >"$tmp/containerd.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
        NODE_SOCK="$tmp/containerd.sock" node_containerd_ready && break
        sleep 0.2
    done
    (NODE_SOCK="$tmp/containerd.sock" node_import_image) || rc=1 # (its `die` ends this subshell only)
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    ((rc == 0)) || log "node: preloading the image failed (the node's start imports it): $(tail -n 3 "$tmp/containerd.log")"
    rm -rf "$tmp"
    return 0
}

# _node_import_layers TAG: podman's image into containerd through an OCI layout beside containerd's root
# (same filesystem). The layout starts with hard links to the blobs containerd holds, so skopeo writes
# only the layers that changed (uncompressed: their digests are the ones containerd stores); the import
# carries those, the manifest and the config (oci_import.py), and finds the rest in containerd's store.
_node_import_layers() {
    local tag=$1 layout have rc=0
    layout="$(containerd_root).oci-import"
    have="$layout.have"
    rm -rf "$layout"
    mkdir -p "$layout/blobs/sha256"
    ctr --address "$(node_sock)" -n k8s.io content ls -q >"$have" || return 1
    local d blob
    while read -r d; do
        blob="$(containerd_root)/io.containerd.content.v1.content/blobs/sha256/${d#sha256:}"
        if [[ -f "$blob" ]]; then ln "$blob" "$layout/blobs/sha256/" 2>/dev/null || true; fi # (else skopeo writes it)
    done <"$have"
    printf '{"imageLayoutVersion": "1.0.0"}' >"$layout/oci-layout"
    printf '{"schemaVersion": 2, "manifests": []}' >"$layout/index.json"
    skopeo copy -q --dest-oci-accept-uncompressed-layers "containers-storage:$tag" "oci:$layout:$tag" \
        && python3 "$INFRA_DIR/oci_import.py" "$layout" "$tag" "$have" >"$layout.carry" \
        && tar -C "$layout" -cf - oci-layout index.json -T "$layout.carry" \
        | ctr --address "$(node_sock)" -n k8s.io images import - >/dev/null || rc=1
    rm -rf "$layout" "$have" "$layout.carry"
    return "$rc"
}

start_node_kubelet() {
    local port hport
    port="$(free_port)"
    hport="$(reuse_or_pick_port "$NODE_STATE/kubelet-healthz-port")"
    echo "$hport" >"$NODE_STATE/kubelet-healthz-port"
    mkdir -p "$NODE_STATE/kubelet"
    cat >"$NODE_STATE/kubelet.yaml" <<EOF
# written by scripts/infra/up.sh: the real node's kubelet
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$(node_sock)
address: $(node_host_ip)
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $hport
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $K8S_STATE/certs/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDNS: [$NODE_DNS_IP]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
registerWithTaints: []
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
EOF
    spawn "$NODE_STATE/kubelet.pid" "$NODE_STATE/kubelet.log" "$(kubelet_bin)" \
        --config "$NODE_STATE/kubelet.yaml" --kubeconfig "$NODE_STATE/kubeconfig" \
        --root-dir "$NODE_STATE/kubelet" --hostname-override "$NODE_NAME" --node-ip "$(node_host_ip)" \
        --node-labels "scalerl.dev/real-node=true,nvidia.com/gpu.present=true" --v=1
}

start_node_kube_proxy() {
    local hport mport
    hport="$(reuse_or_pick_port "$NODE_STATE/kube-proxy-healthz-port")"
    echo "$hport" >"$NODE_STATE/kube-proxy-healthz-port"
    mport="$(free_port)"
    cat >"$NODE_STATE/kube-proxy.yaml" <<EOF
# written by scripts/infra/up.sh: the real node's kube-proxy (iptables); conntrack sysctls left alone
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $NODE_POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:$hport
metricsBindAddress: 127.0.0.1:$mport
clientConnection: {kubeconfig: $NODE_STATE/kubeconfig}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, syncPeriod: 10s, minSyncPeriod: 1s}
EOF
    spawn "$NODE_STATE/kube-proxy.pid" "$NODE_STATE/kube-proxy.log" "$(kube_proxy_bin)" \
        --config "$NODE_STATE/kube-proxy.yaml" --v=1
}

start_node_coredns() {
    local port hport
    port="$(reuse_or_pick_port "$NODE_STATE/coredns-port")"
    hport="$(reuse_or_pick_port "$NODE_STATE/coredns-health-port")"
    echo "$port" >"$NODE_STATE/coredns-port"
    echo "$hport" >"$NODE_STATE/coredns-health-port"
    cat >"$NODE_STATE/Corefile" <<EOF
.:$port {
    bind $(node_host_ip)
    errors
    health 127.0.0.1:$hport
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $NODE_STATE/kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 5
}
EOF
    spawn "$NODE_STATE/coredns.pid" "$NODE_STATE/coredns.log" "$(coredns_bin)" -conf "$NODE_STATE/Corefile"
}

# The kube-dns Service at the kubelet's clusterDNS address, its endpoint the host process above (as
# most clusters run CoreDNS behind that Service; here it is not a Pod: there is no registry for its image).
apply_node_dns_service() {
    "$(kubectl_bin)" --kubeconfig "$NODE_STATE/kubeconfig" apply -f - >/dev/null <<EOF || die "node: could not create the kube-dns Service"
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $NODE_DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: $(cat "$NODE_STATE/coredns-port")}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: $(cat "$NODE_STATE/coredns-port")}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: scalerl-infra}
addressType: IPv4
endpoints:
- addresses: ["$(node_host_ip)"]
ports:
- {name: dns, port: $(cat "$NODE_STATE/coredns-port"), protocol: UDP}
- {name: dns-tcp, port: $(cat "$NODE_STATE/coredns-port"), protocol: TCP}
EOF
}

# Fake GPUs on the real node: a status patch of capacity/allocatable (kubelet keeps an extended resource
# it does not manage); Pods that request nvidia.com/gpu schedule here and run on the CPU.
node_advertise_gpus() {
    "$(kubectl_bin)" --kubeconfig "$NODE_STATE/kubeconfig" patch node "$NODE_NAME" --subresource=status \
        --type=merge -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$NODE_GPUS\"},\"allocatable\":{\"nvidia.com/gpu\":\"$NODE_GPUS\"}}}" \
        >/dev/null || die "node: could not advertise $NODE_GPUS GPUs on $NODE_NAME"
}

node_ready() {
    node_get "/api/v1/nodes/$NODE_NAME" 2>/dev/null | python3 -c '
import json, sys
n = json.load(sys.stdin)
ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
tainted = any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints", []))
sys.exit(0 if ready and not tainted else 1)'
}

# Host settings the node needs; what they were is saved once (for down_node) before the first change.
node_sysctls() {
    local k
    [[ -d /proc/sys/net/bridge ]] || modprobe br_netfilter 2>/dev/null \
        || die "node: br_netfilter is not loaded and cannot be (bridged Pod traffic must pass iptables)"
    if [[ ! -s "$NODE_STATE/sysctl.saved" ]]; then
        for k in "${NODE_SYSCTLS[@]}"; do echo "$k=$(sysctl -n "$k" 2>/dev/null)"; done >"$NODE_STATE/sysctl.saved"
        python3 "$INFRA_DIR/node_cleanup.py" snapshot "$NODE_STATE/iptables.before"
    fi
    sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1 \
        || die "node: could not set the forwarding sysctls"
}

node_running() { pid_alive "$(read_pid "$NODE_STATE/kubelet.pid")" "$(node_kubelet_pattern)"; }

# up_node: everything of the node that is not running healthy (after up_k8s: it needs etcd and the CA).
up_node() {
    local p t0 healthy=1 port
    [[ "$(id -u)" == 0 ]] || die "node: a kubelet and containerd need root"
    mkdir -p "$NODE_STATE"
    for p in "${NODE_PARTS[@]}"; do
        if ! pid_alive "$(read_pid "$NODE_STATE/$p.pid")" "$("node_${p//-/_}_pattern")" \
            || ! "node_${p//-/_}_ready" 2>/dev/null; then
            healthy=0
            break
        fi
    done
    if ((healthy)) && node_ready; then
        log "node: already running and Ready ($NODE_NAME at $(node_api))"
        write_node_kubeconfig
        node_pause_image # (the kubelet's image GC removes an unused pause image under disk pressure)
        node_import_image
        prometheus_follow_node # (observability.sh: the test Prometheus discovers the node's Pods)
        return 0
    fi
    down_node
    t0="$(now)"
    node_sysctls
    node_credentials
    port="$(reuse_or_pick_port "$NODE_STATE/port")"
    log "node: starting its kube-apiserver on $(node_host_ip):$port, containerd, logs in $NODE_STATE"
    start_node_apiserver "$port"
    write_node_kubeconfig
    start_node_containerd
    _node_wait apiserver "$t0"
    start_scheduler "$NODE_STATE" "$(reuse_or_pick_port "$NODE_STATE/scheduler-port")"
    port="$(reuse_or_pick_port "$NODE_STATE/controller-manager-port")"
    [[ "$port" != "$(cat "$NODE_STATE/scheduler-port")" ]] || port="$(free_port)"
    start_node_controller_manager "$port"
    start_node_coredns
    _node_wait containerd "$t0"
    node_pause_image
    node_import_image
    start_node_kubelet
    start_node_kube_proxy
    for p in scheduler controller-manager coredns kubelet kube-proxy; do _node_wait "$p" "$t0"; done
    apply_node_dns_service
    local deadline=$((SECONDS + NODE_READY_TIMEOUT))
    until node_ready; do
        ((SECONDS < deadline)) || { tail -n 30 "$NODE_STATE/kubelet.log" >&2; die "node: $NODE_NAME not Ready after ${NODE_READY_TIMEOUT}s"; }
        sleep 0.5
    done
    node_advertise_gpus
    prometheus_follow_node
    log "node: $NODE_NAME Ready with $NODE_GPUS fake GPUs in $(elapsed "$t0") (API $(node_api))"
}

# down_node: the Pods' containers, the node's processes, then what they left on the host.
down_node() {
    local p
    if node_containerd_ready 2>/dev/null; then
        python3 "$INFRA_DIR/node_cleanup.py" containers "$(node_sock)" || true
    fi
    for p in "${NODE_PARTS[@]}"; do
        stop_pid "$(read_pid "$NODE_STATE/$p.pid")" "$("node_${p//-/_}_pattern")" "node $p"
        rm -f "$NODE_STATE/$p.pid"
    done
    [[ -d "$NODE_STATE" ]] || return 0
    if [[ -x "$(kube_proxy_bin)" && -s "$NODE_STATE/iptables.before" ]]; then
        "$(kube_proxy_bin)" --cleanup >/dev/null 2>&1 || true
    fi
    python3 "$INFRA_DIR/node_cleanup.py" host "$NODE_STATE" "$NODE_BRIDGE" || die "node: could not clean up the host"
}

# Lines for build/infra.env (only while the node's kubelet runs).
node_env_lines() {
    node_running || return 0
    cat <<EOF
NODE_KUBECONFIG=$NODE_STATE/kubeconfig
NODE_API=$(node_api)
NODE_NAME=$NODE_NAME
NODE_HOST_IP=$(node_host_ip)
NODE_IMAGE=$(bash "$REPO_ROOT/scripts/image.sh" --print-tag)
NODE_GPUS=$NODE_GPUS
NODE_LOG_DIR=$NODE_STATE
KUBECTL_BIN=$(kubectl_bin)
EOF
}
