{{/* Names, labels and shared values of the scalerl chart. */}}

{{- define "scalerl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name, at most 40 characters so every "<fullname>-<component>" fits 63. */}}
{{- define "scalerl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "scalerl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; the component label is added by each template. */}}
{{- define "scalerl.labels" -}}
helm.sh/chart: {{ include "scalerl.chart" . }}
app.kubernetes.io/part-of: scalerl
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{ include "scalerl.selectorLabels" . }}
{{- end -}}

{{/* Chart-installed objects are `<name>` + the release as instance. RLJob children use
     app.kubernetes.io/name: scalerl with the RLJob's name as instance; the component label keeps the two apart. */}}
{{- define "scalerl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "scalerl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "scalerl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* imagePullSecrets' names, comma-separated (the operator's SCALERL_DEFAULT_IMAGE_PULL_SECRETS). */}}
{{- define "scalerl.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{- define "scalerl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "scalerl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: set it when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the operator watches in namespace scope, as a JSON list (default: the release's). */}}
{{- define "scalerl.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- .Values.operator.watchNamespaces | uniq | toJson -}}
{{- else -}}
{{- list .Release.Namespace | toJson -}}
{{- end -}}
{{- end -}}

{{- define "scalerl.operatorService" -}}
{{- printf "%s-operator" (include "scalerl.fullname" .) -}}
{{- end -}}

{{- /* The Secret (key `token`) with the bearer token scrapers present to the RLJob roles' /metrics. */ -}}
{{- define "scalerl.scrapeTokenSecret" -}}
{{- default (printf "%s-scrape-token" (include "scalerl.fullname" .)) .Values.metrics.scrapeToken.existingSecret -}}
{{- end -}}

{{- define "scalerl.minioName" -}}
{{- printf "%s-minio" (include "scalerl.fullname" .) -}}
{{- end -}}

{{- define "scalerl.kafkaName" -}}
{{- printf "%s-kafka" (include "scalerl.fullname" .) -}}
{{- end -}}

{{- define "scalerl.otelName" -}}
{{- printf "%s-otel-collector" (include "scalerl.fullname" .) -}}
{{- end -}}

{{/* The Secret with accessKey/secretKey that RLJobs name in spec.store.credentialsSecret. */}}
{{- define "scalerl.s3SecretName" -}}
{{- if .Values.minio.existingSecret -}}
{{- .Values.minio.existingSecret -}}
{{- else -}}
{{- printf "%s-s3" (include "scalerl.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Bootstrap servers an RLJob in this install should use (bundled Kafka first). */}}
{{- define "scalerl.kafkaBootstrap" -}}
{{- if .Values.kafka.enabled -}}
{{- printf "%s.%s.svc:%d" (include "scalerl.kafkaName" .) .Release.Namespace (int .Values.kafka.port) -}}
{{- else -}}
{{- .Values.external.kafkaBootstrap -}}
{{- end -}}
{{- end -}}

{{- define "scalerl.s3Endpoint" -}}
{{- if .Values.minio.enabled -}}
{{- printf "http://%s.%s.svc:%d" (include "scalerl.minioName" .) .Release.Namespace (int .Values.minio.port) -}}
{{- else -}}
{{- .Values.external.s3Endpoint -}}
{{- end -}}
{{- end -}}

{{- define "scalerl.otlpEndpoint" -}}
{{- printf "http://%s.%s.svc:4317" (include "scalerl.otelName" .) .Release.Namespace -}}
{{- end -}}

{{- define "scalerl.leaseName" -}}
{{- printf "%s-operator-leader" (include "scalerl.fullname" .) -}}
{{- end -}}

{{/* What the operator does to RLJobs and their children, in any namespace it watches. */}}
{{- define "scalerl.operatorRules" -}}
- apiGroups: [scalerl.dev]
  resources: [rljobs]
  verbs: [get, list, watch, patch, update]
- apiGroups: [scalerl.dev]
  resources: [rljobs/status]
  verbs: [get, patch, update]
# ownerReferences with blockOwnerDeletion need update on the owner's finalizers.
- apiGroups: [scalerl.dev]
  resources: [rljobs/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [deployments, statefulsets]
  verbs: [get, list, watch, create, update, patch, delete]
# The autoscaler writes replicas through /scale (as HPA does); suspend and deletion scale the learner too.
- apiGroups: [apps]
  resources: [deployments/scale, statefulsets/scale]
  verbs: [get, update, patch]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, update, patch, delete]
# Learner pods: their container restarts count against spec.failurePolicy.maxRestarts; every role's
# pods are watched (a change refreshes the RLJob's status within a second).
# delete: the learner's torchrun group restarts and updates as one (every rank's pod is deleted).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, delete]
# Each job's NetworkPolicy (scalerl_operator.render.netpol); delete: when networkPolicy.enabled is turned off.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
# The learner group's PodDisruptionBudget.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, update, patch, delete]
# Kueue (spec.queueName): the operator creates and owns each queued job's Workload, releases an evicted
# one's quota and finishes it (status).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [get, patch, update]
# The S3 key pair named in spec.store.credentialsSecret (the roles get it as env from the Secret; the
# operator only ever reads one by name, e.g. for store retention at deletion), and the certificate
# Secrets of each job's role endpoints, which the operator makes and renews (server-side apply: patch,
# create for the first apply). Never list or watch: it reads no Secret it was not pointed at.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
# cert-manager (rpc.certificates: auto, when the cluster serves it, or cert-manager): each job's Issuers
# and Certificates (scalerl_operator.control.rpc_certmanager); status: a certificate its replaced CA did
# not sign is issued again (the Issuing condition, as `cmctl renew` sets it).
- apiGroups: [cert-manager.io]
  resources: [certificates, issuers]
  verbs: [get, create, patch]
- apiGroups: [cert-manager.io]
  resources: [certificates/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* The operator's command-line arguments (`python -m scalerl_operator ...`). */}}
{{- define "scalerl.operatorArgs" -}}
{{- if eq .Values.operator.scope "cluster" }}
- --all-namespaces
{{- else }}
{{- range include "scalerl.watchNamespaces" . | fromJsonArray }}
- --namespace={{ . }}
{{- end }}
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
{{- if .Values.operator.leaderElection.enabled }}
- --leader-election
- --lease-name={{ include "scalerl.leaseName" . }}
- --lease-namespace={{ .Release.Namespace }}
- --lease-duration-seconds={{ .Values.operator.leaderElection.leaseDurationSeconds }}
{{- end }}
- --metrics-port={{ .Values.operator.metricsPort }}
- --interval-seconds={{ .Values.operator.intervalSeconds }}
- --workers={{ .Values.operator.workers }}
- --backoff-max-seconds={{ .Values.operator.backoffMaxSeconds }}
- --kafka-timeout-seconds={{ .Values.operator.kafkaTimeoutSeconds }}
- --log-level={{ .Values.operator.logLevel }}
{{- end -}}

{{/* The shared part of the `helm test` pods' spec; the caller appends command and args. */}}
{{- define "scalerl.testPodSpec" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.operator.podSecurityContext | nindent 2 }}
containers:
  - name: test
    image: {{ .Values.tests.image | default (include "scalerl.image" .) }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    resources:
      requests: {cpu: 50m, memory: 64Mi}
      limits: {memory: 256Mi}
    securityContext:
      {{- toYaml .Values.operator.securityContext | nindent 6 }}
{{- end -}}
