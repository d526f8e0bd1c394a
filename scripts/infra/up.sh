#!/usr/bin/env bash
# Build (once, cached outside the checkout) and start the real test infrastructure on 127.0.0.1:
#   - a single-node KRaft Kafka broker (jars fetched by Maven, run with Java 17)
#   - a MinIO S3 server (built with `go install`)
#   - k8s: etcd + kube-apiserver (built from source, see k8s.sh), the helm client and grpcurl
#   - cluster: a Pod-running cluster beside it (cluster.sh): a second kube-apiserver on the same etcd,
#     kube-scheduler, kube-controller-manager and kwok with fake GPU and CPU Nodes (needs k8s)
#   - prometheus (built from source with kubernetes SD) and jaeger (Jaeger v2 built from source),
#     see observability.sh
#   - kueue: Kueue's controller manager on the cluster (kueue.sh; needs cluster)
#   - certmanager: cert-manager's certificate controllers on the plain API server, its CRDs installed
#     there (certmanager.sh; needs k8s)
#   - node: a real node (node.sh; needs k8s, root): its own kube-apiserver on the host's address, scheduler,
#     controller-manager, containerd + runc + CNI, kubelet, kube-proxy, CoreDNS, the project's image
#     (scripts/image.sh, built here when missing) imported into containerd, fake GPUs on the node
# then write build/infra.env (KAFKA_BOOTSTRAP; the SASL_SSL listener's KAFKA_SASL_BOOTSTRAP,
# KAFKA_SASL_{MECHANISM,USERNAME,PASSWORD} and KAFKA_SSL_CAFILE (a self-signed test CA); S3_ENDPOINT,
# S3_ACCESS_KEY, S3_SECRET_KEY, S3_REGION, KUBECONFIG, K8S_API, HELM_BIN, GRPCURL_BIN, CLUSTER_KUBECONFIG, CLUSTER_API,
# PROMETHEUS_URL, PROMETHEUS_FILE_SD, JAEGER_QUERY_URL, JAEGER_OTLP_GRPC, JAEGER_PODS_OTLP_GRPC, PIDs and log paths).
# Idempotent: a server that is already running and healthy is reused.
#
# Usage: scripts/infra/up.sh [--build-only] [kafka|minio|k8s|cluster|prometheus|jaeger|kueue|certmanager|node ...]
#   no service named: all of them (cluster and certmanager start k8s too, kueue starts cluster).  --build-only: fetch/build into the cache, start nothing.
# Env: SCALERL_CACHE (default ~/.cache/scalerl), SCALERL_KAFKA_READY_TIMEOUT (120),
#      SCALERL_MINIO_READY_TIMEOUT (60), SCALERL_KAFKA_HEAP (-Xmx512m), SCALERL_KAFKA_JVM_OPTS,
#      SCALERL_MAVEN_REPO (a Maven local repository other than ~/.m2/repository),
#      SCALERL_K8S_READY_TIMEOUT (120), SCALERL_{K8S,ETCD,HELM,GRPCURL}_VERSION (pins in k8s.sh),
#      SCALERL_CLUSTER_READY_TIMEOUT (120), SCALERL_KWOK_VERSION (v0.8.0; v0.7.0 with go < 1.26),
#      SCALERL_CLUSTER_TOLERATION_S (2), SCALERL_CLUSTER_NODE_GRACE_S (20) (cluster.sh).
#      SCALERL_{PROMETHEUS,JAEGER}_READY_TIMEOUT (60), SCALERL_JAEGER_VERSION (observability.sh).
#      SCALERL_KUEUE_VERSION (v0.17.0), SCALERL_KUEUE_READY_TIMEOUT (90) (kueue.sh).
#      SCALERL_CERTMANAGER_VERSION (v1.21.2), SCALERL_CERTMANAGER_READY_TIMEOUT (60) (certmanager.sh).
#      SCALERL_BUILD_LANES (2: two builds at once; 1: one after the other), SCALERL_BUILD_NICE (10: the
#      compiles' niceness; make test's prebuild sets 0).
#      SCALERL_COREDNS_VERSION (v1.14.7), SCALERL_NODE_GPUS (4), SCALERL_NODE_READY_TIMEOUT (180) (node.sh);
#      the image's variables in scripts/image.sh (SCALERL_PYTHON_IMAGE, SCALERL_IMAGE_TAG, SCALERL_IMAGE_CA).
# shellcheck source=scripts/infra/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

build_only=0
services=()
for arg in "$@"; do
    case "$arg" in
        --build-only) build_only=1 ;;
        kafka | minio | k8s | cluster | prometheus | jaeger | kueue | certmanager | node) services+=("$arg") ;;
        -h | --help) sed -n '2,36p' "$0"; exit 0 ;;
        *) die "unknown argument $arg (expected --build-only, kafka, minio, k8s, cluster, prometheus, jaeger, kueue, certmanager, node)" ;;
    esac
done
((${#services[@]})) || services=(kafka minio k8s cluster kueue certmanager prometheus jaeger node)
[[ " ${services[*]} " != *" certmanager "* || " ${services[*]} " == *" k8s "* ]] || services+=(k8s)
[[ " ${services[*]} " != *" node "* || " ${services[*]} " == *" k8s "* ]] || services+=(k8s)
[[ " ${services[*]} " != *" kueue "* || " ${services[*]} " == *" cluster "* ]] || services+=(cluster)
[[ " ${services[*]} " != *" cluster "* || " ${services[*]} " == *" k8s "* ]] || services+=(k8s)
want() { [[ " ${services[*]} " == *" $1 "* ]]; }

lanes="${SCALERL_BUILD_LANES:-2}"
[[ "$lanes" == 1 || "$lanes" == 2 ]] || { log "ERROR: SCALERL_BUILD_LANES=$lanes: expected 1 or 2"; exit 2; }

T0="$(now)"
mkdir -p "$STATE/kafka" "$STATE/minio"

# What the cache lacks is built in two lanes at once (SCALERL_BUILD_LANES=1: one after the other), of
# about equal length cold (idle 2 cores: about 18 and 16 minutes). On 2 cores the compiles share the
# CPU either way; what the second lane buys is that one lane's module downloads, `go mod tidy` and
# single-threaded links run beside the other's compiles, and the CPU the tests leave idle is used.
lane_servers() {
    want kafka && build_kafka
    want minio && build_minio
    want k8s && build_k8s
    want cluster && build_cluster_kube
    want node && build_node
    return 0
}
lane_observability() {
    want prometheus && build_prometheus
    want cluster && build_kwok
    want jaeger && build_jaeger
    want kueue && build_kueue
    want certmanager && build_certmanager
    return 0
}
# The project's image of this checkout (node), built every time: from cached layers in about 20 s, so
# the Pods never run an older checkout's code; cold, mostly downloads and a layer commit, beside the compiles;
# then imported into the node's containerd root while the compiles go on (node.sh's preload_node_image).
image_lane=""
if want node; then
    (bash "$REPO_ROOT/scripts/image.sh" >/dev/null && preload_node_image) & image_lane=$!
fi
if [[ "$lanes" == 1 ]]; then
    lane_servers
    lane_observability
else
    lane_servers & lane_a=$!
    lane_observability & lane_b=$!
    rc=0
    wait "$lane_a" || rc=$?
    wait "$lane_b" || rc=$?
    ((rc == 0)) || die "a server build failed (see its lines above)"
fi
[[ -z "$image_lane" ]] || wait "$image_lane" || die "the image build failed (see its lines above)"
if ((build_only)); then
    log "build done in $(elapsed "$T0")"
    exit 0
fi

# Start what is not already running; both start in parallel, then we wait for each.
kafka_t0="" minio_t0=""
if want kafka; then
    pid="$(read_pid "$STATE/kafka/pid")"
    if pid_alive "$pid" "$(kafka_pattern)" && kafka_ready 2>/dev/null && kafka_has_sasl; then
        log "kafka: already running and healthy on 127.0.0.1:$(cat "$STATE/kafka/port") (pid $pid)"
        kafka_scram_users # (a broker restarted on an old data dir by an interrupted run may lack them)
    else
        stop_pid "$pid" "$(kafka_pattern)" kafka # unhealthy, or started without SASL_SSL: restart it
        port="$(reuse_or_pick_port "$STATE/kafka/port")"
        cport="$(reuse_or_pick_port "$STATE/kafka/cport")"
        [[ "$port" != "$cport" ]] || cport="$(free_port)"
        sport="$(reuse_or_pick_port "$STATE/kafka/sport")"
        while [[ "$sport" == "$port" || "$sport" == "$cport" ]]; do sport="$(free_port)"; done
        write_kafka_config "$port" "$cport" "$sport"
        kafka_t0="$(now)"
        log "kafka: starting on 127.0.0.1:$port (SASL_SSL $sport, controller $cport), log $STATE/kafka/kafka.log"
        start_kafka
    fi
fi
if want minio; then
    pid="$(read_pid "$STATE/minio/pid")"
    if pid_alive "$pid" "$(minio_pattern)" && pid_alive "$pid" "--address :" && minio_ready 2>/dev/null; then
        log "minio: already running and healthy on 127.0.0.1:$(cat "$STATE/minio/port") (pid $pid)"
    else
        stop_pid "$pid" "$(minio_pattern)" minio
        port="$(reuse_or_pick_port "$STATE/minio/port")"
        minio_t0="$(now)"
        log "minio: starting on 127.0.0.1:$port, log $STATE/minio/minio.log"
        start_minio "$port"
    fi
fi
prometheus_t0="" jaeger_t0=""
want prometheus && up_observability prometheus
want jaeger && up_observability jaeger
[[ -z "$minio_t0" ]] || wait_minio "$minio_t0" # MinIO is up in about a second, the JVM takes longer
[[ -z "$prometheus_t0" ]] || wait_prometheus "$prometheus_t0"
[[ -z "$jaeger_t0" ]] || wait_jaeger "$jaeger_t0"
want k8s && up_k8s # etcd + kube-apiserver start while the JVM warms up
want cluster && up_cluster
want kueue && up_kueue
want certmanager && up_certmanager
if want node; then
    # the servers up so far, for their tests to start while the image goes into the node's containerd
    # (minutes: 5 of a warm make test's first 7); the node's lines come with the last write, once it is Ready
    write_env
    up_node
fi
[[ -z "$kafka_t0" ]] || wait_kafka "$kafka_t0"

# Every service started so far (this run or an earlier one) is written; tests check the keys they need.
write_env
log "up in $(elapsed "$T0"); wrote $ENV_FILE"
