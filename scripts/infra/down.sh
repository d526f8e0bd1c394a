#!/usr/bin/env bash
# Stop the servers started by scripts/infra/up.sh: SIGTERM, then SIGKILL after a grace period
# (SCALERL_STOP_GRACE, default 20 s). Logs and data under build/infra/ are kept, so a later up.sh
# continues with the same topics and buckets; build/infra.env is removed (it names running servers).
#
# Usage: scripts/infra/down.sh [--purge] [kafka|minio|k8s|cluster|prometheus|jaeger|kueue|certmanager|node ...]
#   k8s stops the Pod-running cluster and the real node too (their API servers use k8s's etcd); k8s and
#   cluster stop kueue; k8s stops certmanager. node: its containers and processes, and what it changed on the host.
#   --purge: also delete the data directories (build/infra/*/data, build/infra/k8s/etcd-data); logs
#   are still kept.
# shellcheck source=scripts/infra/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

purge=0
services=()
for arg in "$@"; do
    case "$arg" in
        --purge) purge=1 ;;
        kafka | minio | k8s | cluster | prometheus | jaeger | kueue | certmanager | node) services+=("$arg") ;;
        -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
        *) die "unknown argument $arg (expected --purge, kafka, minio, k8s, cluster, prometheus, jaeger, kueue, certmanager, node)" ;;
    esac
done
((${#services[@]})) || services=(kafka minio k8s prometheus jaeger)

for svc in "${services[@]}"; do
    if [[ "$svc" == kueue ]]; then
        down_kueue
        continue
    fi
    if [[ "$svc" == certmanager ]]; then
        down_certmanager
        continue
    fi
    if [[ "$svc" == cluster ]]; then
        down_kueue
        down_cluster
        continue
    fi
    if [[ "$svc" == node ]]; then
        down_node
        continue
    fi
    if [[ "$svc" == k8s ]]; then
        down_certmanager
        down_kueue
        down_cluster
        down_node
        down_k8s
        if ((purge)); then
            log "k8s: purging $K8S_STATE/etcd-data"
            rm -rf "${K8S_STATE:?}/etcd-data"
        fi
        continue
    fi
    pidfile="$STATE/$svc/pid"
    pid="$(read_pid "$pidfile")"
    pattern="$("${svc}_pattern")"
    if pid_alive "$pid" "$pattern"; then
        stop_pid "$pid" "$pattern" "$svc"
    else
        log "$svc: not running"
    fi
    rm -f "$pidfile"
    if ((purge)); then
        log "$svc: purging $STATE/$svc/data"
        rm -rf "${STATE:?}/$svc/data"
    fi
done
if [[ " ${services[*]} " == *" kafka "* || " ${services[*]} " == *" minio "* ]]; then
    rm -f "$ENV_FILE"
elif [[ -f "$ENV_FILE" ]]; then
    write_env # only k8s/cluster/prometheus/jaeger stopped: Kafka and MinIO still run, drop their lines
fi
log "down"
