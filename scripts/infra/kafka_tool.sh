#!/usr/bin/env bash
# Run one of Kafka's command-line tools against the test broker (scripts/infra/up.sh), with the jars of
# the cached Kafka (kafka/pom.xml includes kafka-tools) and the broker's address filled in.
#
# Usage: scripts/infra/kafka_tool.sh TOOL [ARGS...]
#   TOOL: console-consumer | console-producer | consumer-groups | topics | get-offsets
#   --bootstrap-server is added (from build/infra.env) unless ARGS give one.
# Examples (JOB = the job's topic prefix):
#   scripts/infra/kafka_tool.sh topics --list
#   scripts/infra/kafka_tool.sh console-consumer --topic JOB.dlq --from-beginning \
#       --property print.headers=true --property print.offset=true --max-messages 10
#   scripts/infra/kafka_tool.sh consumer-groups --describe --group JOB.learner
#   scripts/infra/kafka_tool.sh get-offsets --topic JOB.scored
# shellcheck source=scripts/infra/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

declare -A TOOLS=(
    [console-consumer]=org.apache.kafka.tools.consumer.ConsoleConsumer
    [console-producer]=org.apache.kafka.tools.ConsoleProducer
    [consumer-groups]=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
    [topics]=org.apache.kafka.tools.TopicCommand
    [get-offsets]=org.apache.kafka.tools.GetOffsetShell
)
tool="${1:-}"
if [[ -z "$tool" || "$tool" == -h || "$tool" == --help ]]; then
    sed -n '2,14p' "$0"; exit 0
fi
[[ -n "${TOOLS[$tool]:-}" ]] || { log "ERROR: tool: '$tool' is not one of: ${!TOOLS[*]}"; exit 2; }
shift
libs="$(kafka_home)/libs"
[[ -f "$libs/kafka-tools-$KAFKA_VERSION.jar" ]] \
    || die "no $libs/kafka-tools-$KAFKA_VERSION.jar: run scripts/infra/up.sh (it fetches the jars of kafka/pom.xml)"
args=("$@")
if [[ " $* " != *" --bootstrap-server "* ]]; then
    [[ -s "$ENV_FILE" ]] || die "no $ENV_FILE: start the test servers with scripts/infra/up.sh"
    bootstrap="$(sed -n 's/^\(export \)\{0,1\}KAFKA_BOOTSTRAP=//p' "$ENV_FILE" | tail -1 | tr -d "\"'")"
    [[ -n "$bootstrap" ]] || die "$ENV_FILE names no KAFKA_BOOTSTRAP"
    args=(--bootstrap-server "$bootstrap" "${args[@]}")
fi
exec java -cp "$libs/*" "${TOOLS[$tool]}" "${args[@]}"
