#!/usr/bin/env bash
# Restart the Kafka broker on the same port and data directory (for broker-restart fault tests).
# Committed data and consumer-group offsets survive; clients reconnect to the same bootstrap address.
#
# Usage: scripts/infra/restart_kafka.sh [--kill] [--down-for SECONDS]
#   --kill: crash it (SIGKILL) instead of a clean SIGTERM shutdown.
#   --down-for S: stay stopped for S seconds before starting again (default 0).
# shellcheck source=scripts/infra/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

sig=TERM
down_for=0
while (($#)); do
    case "$1" in
        --kill) sig=KILL ;;
        --down-for) down_for="${2:?--down-for needs seconds}"; shift ;;
        -h | --help) sed -n '2,8p' "$0"; exit 0 ;;
        *) die "unknown argument $1" ;;
    esac
    shift
done

[[ -s "$STATE/kafka/server.properties" ]] || die "no broker configured in $STATE/kafka; run scripts/infra/up.sh first"
T0="$(now)"
stop_pid "$(read_pid "$STATE/kafka/pid")" "$(kafka_pattern)" kafka "$sig"
rm -f "$STATE/kafka/pid"
sleep "$down_for"
port="$(cat "$STATE/kafka/port")"
cport="$(cat "$STATE/kafka/cport")"
port_free "$port" || die "kafka: port $port is taken by another process; cannot restart on the same port"
sport="$(cat "$STATE/kafka/sport" 2>/dev/null || free_port)"
port_free "$sport" || die "kafka: SASL_SSL port $sport is taken by another process; cannot restart"
write_kafka_config "$port" "$cport" "$sport" # same ports and data dir; picks up config changes of lib.sh
log "kafka: starting again on 127.0.0.1:$port (same data dir)"
t0="$(now)"
start_kafka
wait_kafka "$t0"
[[ -s "$STATE/minio/port" ]] && write_env
log "kafka: restarted in $(elapsed "$T0")"
