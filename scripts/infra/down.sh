#!/usr/bin/env bash
# Stop the servers started by scripts/infra/up.sh: SIGTERM, then SIGKILL after a grace period
# (SCALERL_STOP_GRACE, default 20 s). Logs and data under build/infra/ are kept, so a later up.sh
# continues with the same topics and buckets; build/infra.env is removed (it names running servers).
#
# Usage: scripts/infra/down.sh [--purge] [kafka|minio ...]
#   --purge: also delete the data directories (build/infra/*/data); logs are still kept.
# shellcheck source=scripts/infra/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

purge=0
services=()
for arg in "$@"; do
    case "$arg" in
        --purge) purge=1 ;;
        kafka | minio) services+=("$arg") ;;
        -h | --help) sed -n '2,8p' "$0"; exit 0 ;;
        *) die "unknown argument $arg (expected --purge, kafka, minio)" ;;
    esac
done
((${#services[@]})) || services=(kafka minio)

for svc in "${services[@]}"; do
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
rm -f "$ENV_FILE"
log "down"
