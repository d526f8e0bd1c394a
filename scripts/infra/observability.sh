# shellcheck shell=bash
# Observability servers for the tests: Prometheus (scrapes the roles' side ports) and Jaeger v2 (receives
# the roles' OTLP traces, in-memory storage, query API). Sourced by lib.sh, never run.
#
# Layout
#   cache:  bin/prometheus-k8s-<module version>   `go install`ed with file and kubernetes SD only (see below)
#           bin/jaeger-<version>                   built through src/jaeger-<version>/ (a wrapper module)
#   state:  build/infra/prometheus/{prometheus.yml,file_sd/,data/,prometheus.log,pid,port,node-token,
#                                   scrape-token}
#           build/infra/jaeger/{config.yaml,jaeger.log,pid,port,otlp-grpc-port,otlp-http-port,health-port,
#                               otlp-pods-port}
#
# Prometheus has two scrape jobs:
#   scalerl       whatever the tests put in build/infra/prometheus/file_sd/*.json (file-based service
#                 discovery, re-read every 2 s): each test writes its own targets file and removes it after.
#   kubernetes-pods  the Pods of the real node (node.sh), found through its API server (kubernetes_sd_configs,
#                 role pod, the admin token in node-token, the test CA): those annotated
#                 prometheus.io/scrape "true", at <pod IP>:<prometheus.io/port>, as the operator renders the
#                 RLJob role Pods; each series labelled as the chart's PodMonitor labels them (namespace, pod,
#                 rljob from label scalerl.dev/job, role from app.kubernetes.io/component), so the chart's
#                 dashboards read them unchanged. Written only once the node has a port and a kubeconfig:
#                 up_node calls prometheus_follow_node, which rewrites the config and reloads Prometheus
#                 (SIGHUP) when it changed, so the order in which the two start does not matter.
#
# Both scrape the roles' side ports as the roles serve them (scalerl.rpc.sidetls): HTTPS when the target says
# so (file_sd: the label __scheme__ "https"; Pods: the annotation prometheus.io/scheme), without verifying the
# per-job CA, and with the bearer token in scrape-token (made once, 0600; PROMETHEUS_SCRAPE_TOKEN_FILE in
# build/infra.env) that /metrics asks for: the tests give it to the launcher (SCALERL_METRICS_TOKEN_FILE)
# and to the chart (metrics.scrapeToken.existingSecret). Prometheus reads the file at every scrape.
#
# Jaeger's OTLP receivers: gRPC and HTTP on loopback (the tests' processes), and a second gRPC receiver
# `otlp/pods` on the host's address (as Kafka's PODS listener and MinIO) that the node's Pods reach:
# JAEGER_PODS_OTLP_GRPC in build/infra.env (tests/real_node expose it as Service jaeger.scalerl-infra:4317).
#
# Jaeger v2 is `cmd/jaeger` of github.com/jaegertracing/jaeger, whose go.mod replaces
# github.com/Shopify/sarama, so it cannot be `go install`ed: a wrapper module requires it and repeats
# that one replace line (as for kube-apiserver in k8s.sh).

PROMETHEUS_MODULE_VERSION="${SCALERL_PROMETHEUS_MODULE_VERSION:-v0.316.0}"
JAEGER_VERSION="${SCALERL_JAEGER_VERSION:-v1.76.0}"
JAEGER_REPLACE="github.com/Shopify/sarama => github.com/Shopify/sarama v1.33.0"
PROMETHEUS_READY_TIMEOUT="${SCALERL_PROMETHEUS_READY_TIMEOUT:-60}"
JAEGER_READY_TIMEOUT="${SCALERL_JAEGER_READY_TIMEOUT:-60}"

jaeger_bin() { echo "$CACHE/bin/jaeger-$JAEGER_VERSION"; }

# The Prometheus binary in the cache (built with kubernetes SD); empty when it is not there yet.
prometheus_bin() {
    local go="$CACHE/bin/prometheus-k8s-$PROMETHEUS_MODULE_VERSION"
    if [[ -x "$go" ]]; then echo "$go"; fi
}

# Debian's package is built without the kubernetes service discovery (its promtool rejects
# kubernetes_sd_configs), so Prometheus is built from source with file SD (always in) and kubernetes SD
# only: the build tags remove_all_sd,enable_kubernetes_sd leave the cloud SDs out.
_build_prometheus() {
    local t0
    [[ -n "$(prometheus_bin)" ]] && return 0
    command -v go >/dev/null || die "go is required to build Prometheus"
    t0="$(now)"
    mkdir -p "$CACHE/bin"
    go_install_to "$CACHE/bin/prometheus-k8s-$PROMETHEUS_MODULE_VERSION" \
        "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_MODULE_VERSION" "-s -w" \
        remove_all_sd,enable_kubernetes_sd
    log "prometheus: built in $(elapsed "$t0")"
}

_build_jaeger() {
    local bin dir t0
    bin="$(jaeger_bin)"
    [[ -x "$bin" ]] && return 0
    command -v go >/dev/null || die "go is required to build Jaeger"
    t0="$(now)"
    dir="$CACHE/src/jaeger-$JAEGER_VERSION"
    log "jaeger: building github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION in $dir (cold: minutes)"
    rm -rf "$dir"
    mkdir -p "$dir" "$CACHE/bin"
    cat >"$dir/tools.go" <<'EOF'
//go:build tools

// Package tools pins the Jaeger v2 command into this wrapper module.
package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
EOF
    (cd "$dir" && GOTOOLCHAIN=local go mod init scalerl.local/jaeger-build >build.log 2>&1 \
        && printf 'require github.com/jaegertracing/jaeger %s\nreplace %s\n' "$JAEGER_VERSION" "$JAEGER_REPLACE" \
            >>go.mod \
        && GOTOOLCHAIN=local GOFLAGS=-mod=mod nice -n "${SCALERL_BUILD_NICE:-10}" go mod tidy >>build.log 2>&1) \
        || { tail -n 40 "$dir/build.log" >&2; die "go mod tidy of the Jaeger wrapper failed"; }
    _go_build_in "$dir" "$bin" github.com/jaegertracing/jaeger/cmd/jaeger "-s -w"
    log "jaeger: built in $(elapsed "$t0") ($(du -sh "$bin" | cut -f1))"
}

build_prometheus() {
    if [[ -n "$(prometheus_bin)" ]]; then
        log "prometheus: using cached binary $(prometheus_bin)"
    else
        with_build_lock prometheus _build_prometheus
    fi
}

build_jaeger() {
    if [[ -x "$(jaeger_bin)" ]]; then
        log "jaeger: using cached binary $(jaeger_bin)"
    else
        with_build_lock jaeger _build_jaeger
    fi
}

# ---- Prometheus ------------------------------------------------------------------------------------

prometheus_pattern() { echo "$STATE/prometheus/prometheus.yml"; }

write_prometheus_config() {
    local d="$STATE/prometheus"
    mkdir -p "$d/data" "$d/file_sd"
    [[ -s "$d/scrape-token" ]] || (umask 077 && head -c 32 /dev/urandom | base64 | tr -d '/+=\n' >"$d/scrape-token")
    cat >"$d/prometheus.yml" <<EOF
# generated by scripts/infra/up.sh: the tests' targets come from file_sd/*.json (one file per test);
# a scrape every 2 s (a role's /metrics asks Kafka for its lag: allow it 2 s on a loaded machine)
global:
  scrape_interval: 2s
  scrape_timeout: 2s
  evaluation_interval: 2s
scrape_configs:
  - job_name: scalerl
    file_sd_configs:
      - files: ["$d/file_sd/*.json"]
        refresh_interval: 2s
    tls_config:
      insecure_skip_verify: true
    authorization:
      credentials_file: $d/scrape-token
EOF
    prometheus_node_job >>"$d/prometheus.yml"
}

# The `kubernetes-pods` job (see the header) once the real node has its API port and kubeconfig; nothing before.
prometheus_node_job() {
    local d="$STATE/prometheus"
    [[ -s "$NODE_STATE/port" && -s "$NODE_STATE/kubeconfig" && -s "$K8S_STATE/tokens.csv" ]] || return 0
    (umask 077 && k8s_token >"$d/node-token")
    cat <<EOF
  # the real node's Pods annotated prometheus.io/scrape (the RLJob role Pods), found through its API server
  - job_name: kubernetes-pods
    kubernetes_sd_configs:
      - role: pod
        api_server: $(node_api)
        tls_config:
          ca_file: $K8S_STATE/certs/ca.crt
        authorization:
          credentials_file: $d/node-token
    tls_config:
      insecure_skip_verify: true
    authorization:
      credentials_file: $d/scrape-token
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
        regex: "true"
        action: keep
      - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scheme]
        regex: (https?)
        target_label: __scheme__
      - source_labels: [__meta_kubernetes_pod_phase]
        regex: Pending|Running
        action: keep
      - source_labels: [__meta_kubernetes_pod_ip, __meta_kubernetes_pod_annotation_prometheus_io_port]
        regex: "([0-9.]+);([0-9]+)"
        replacement: "\$1:\$2"
        target_label: __address__
      - source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
      - source_labels: [__meta_kubernetes_pod_label_scalerl_dev_job]
        target_label: rljob
      - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
        target_label: role
EOF
}

# prometheus_follow_node: called by up_node once the node is up; rewrites the config and reloads a running
# Prometheus (SIGHUP) when the `kubernetes-pods` job changed (the node's first start, a new API port).
prometheus_follow_node() {
    local d="$STATE/prometheus" pid before
    pid="$(read_pid "$d/pid")"
    pid_alive "$pid" "$(prometheus_pattern)" || return 0
    before="$(cat "$d/prometheus.yml" 2>/dev/null || true)"
    write_prometheus_config
    [[ "$(cat "$d/prometheus.yml")" != "$before" ]] || return 0
    log "prometheus: scraping the real node's Pods ($(node_api)); reloading its config"
    kill -HUP "$pid"
}

start_prometheus() {
    local d="$STATE/prometheus" port="$1"
    write_prometheus_config
    echo "$port" >"$d/port"
    spawn "$d/pid" "$d/prometheus.log" "$(prometheus_bin)" --config.file="$d/prometheus.yml" \
        --storage.tsdb.path="$d/data" --storage.tsdb.retention.time=2h \
        --web.listen-address="127.0.0.1:$port" --log.level=warn
}

prometheus_ready() {
    python3 "$INFRA_DIR/probe.py" http "http://127.0.0.1:$(cat "$STATE/prometheus/port")/-/ready"
}

wait_prometheus() { wait_ready prometheus "$1" "$PROMETHEUS_READY_TIMEOUT" 0.3; }

# ---- Jaeger v2 ------------------------------------------------------------------------------------

jaeger_pattern() { echo "$STATE/jaeger/config.yaml"; }

write_jaeger_config() {
    local d="$STATE/jaeger"
    mkdir -p "$d"
    local port grpc http health pods
    port="$(reuse_or_pick_port "$d/port")"
    grpc="$(reuse_or_pick_port "$d/otlp-grpc-port")"
    http="$(reuse_or_pick_port "$d/otlp-http-port")"
    health="$(reuse_or_pick_port "$d/health-port")"
    pods="$(reuse_or_pick_port "$d/otlp-pods-port")"
    # (each picked on its own: two of them can come back equal when none was stored)
    while [[ "$grpc" == "$port" ]]; do grpc="$(free_port)"; done
    while [[ "$http" == "$port" || "$http" == "$grpc" ]]; do http="$(free_port)"; done
    while [[ "$health" == "$port" || "$health" == "$grpc" || "$health" == "$http" ]]; do health="$(free_port)"; done
    while [[ " $port $grpc $http $health " == *" $pods "* ]]; do pods="$(free_port)"; done
    echo "$port" >"$d/port"
    echo "$grpc" >"$d/otlp-grpc-port"
    echo "$http" >"$d/otlp-http-port"
    echo "$health" >"$d/health-port"
    echo "$pods" >"$d/otlp-pods-port"
    cat >"$d/config.yaml" <<EOF
# generated by scripts/infra/up.sh: Jaeger v2, OTLP in (loopback, and gRPC on the host's address for the
# real node's Pods), in-memory storage, query API (loopback only)
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp, otlp/pods]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:$health
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:$port
    grpc:
      endpoint: 127.0.0.1:$(free_port)
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$grpc
      http:
        endpoint: 127.0.0.1:$http
  otlp/pods:
    protocols:
      grpc:
        endpoint: $(host_ip):$pods
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
EOF
}

start_jaeger() {
    local d="$STATE/jaeger"
    write_jaeger_config
    spawn "$d/pid" "$d/jaeger.log" "$(jaeger_bin)" --config "$d/config.yaml"
}

jaeger_ready() {
    python3 "$INFRA_DIR/probe.py" http "http://127.0.0.1:$(cat "$STATE/jaeger/port")/api/services"
}

wait_jaeger() { wait_ready jaeger "$1" "$JAEGER_READY_TIMEOUT" 0.3; }

# Whether the running server has this file's setup (else up.sh restarts it): Jaeger, the Pods' receiver;
# Prometheus, the binary with kubernetes SD (it follows the node through prometheus_follow_node).
jaeger_current() { grep -q "otlp/pods" "$STATE/jaeger/config.yaml" 2>/dev/null; }
prometheus_current() {
    [[ -n "$(prometheus_bin)" ]] && pid_alive "$(read_pid "$STATE/prometheus/pid")" "$(prometheus_bin)"
}

# up_observability NAME: start prometheus or jaeger unless it already runs healthy; sets <name>_t0 to
# wait on (empty when it was running).
up_observability() {
    local name="$1" pid port
    pid="$(read_pid "$STATE/$name/pid")"
    if pid_alive "$pid" "$("${name}_pattern")" && "${name}_ready" 2>/dev/null && "${name}_current"; then
        log "$name: already running and healthy on 127.0.0.1:$(cat "$STATE/$name/port") (pid $pid)"
        printf -v "${name}_t0" '%s' ""
        return 0
    fi
    stop_pid "$pid" "$("${name}_pattern")" "$name"
    mkdir -p "$STATE/$name"
    printf -v "${name}_t0" '%s' "$(now)"
    if [[ "$name" == prometheus ]]; then
        port="$(reuse_or_pick_port "$STATE/prometheus/port")"
        log "prometheus: starting on 127.0.0.1:$port, log $STATE/prometheus/prometheus.log"
        start_prometheus "$port"
    else
        start_jaeger
        log "jaeger: starting (query 127.0.0.1:$(cat "$STATE/jaeger/port"), OTLP gRPC" \
            "127.0.0.1:$(cat "$STATE/jaeger/otlp-grpc-port"), for Pods" \
            "$(host_ip):$(cat "$STATE/jaeger/otlp-pods-port"))," \
            "log $STATE/jaeger/jaeger.log"
    fi
}

observability_env_lines() {
    local d="$STATE/prometheus"
    if [[ -s "$d/port" ]] && pid_alive "$(read_pid "$d/pid")" "$(prometheus_pattern)"; then
        cat <<EOF
PROMETHEUS_URL=http://127.0.0.1:$(cat "$d/port")
PROMETHEUS_FILE_SD=$d/file_sd
PROMETHEUS_SCRAPE_TOKEN_FILE=$d/scrape-token
PROMETHEUS_BIN=$(prometheus_bin)
PROMETHEUS_PID=$(read_pid "$d/pid")
PROMETHEUS_LOG=$d/prometheus.log
EOF
    fi
    d="$STATE/jaeger"
    if [[ -s "$d/port" ]] && pid_alive "$(read_pid "$d/pid")" "$(jaeger_pattern)"; then
        cat <<EOF
JAEGER_QUERY_URL=http://127.0.0.1:$(cat "$d/port")
JAEGER_OTLP_GRPC=http://127.0.0.1:$(cat "$d/otlp-grpc-port")
JAEGER_OTLP_HTTP=http://127.0.0.1:$(cat "$d/otlp-http-port")
JAEGER_VERSION=$JAEGER_VERSION
JAEGER_PID=$(read_pid "$d/pid")
JAEGER_LOG=$d/jaeger.log
EOF
        ! jaeger_current || echo "JAEGER_PODS_OTLP_GRPC=http://$(host_ip):$(cat "$d/otlp-pods-port")"
    fi
}
