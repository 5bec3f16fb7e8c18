{{/* Names. */}}
{{- define "loader.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "loader.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "loader.coordinatorName" -}}
{{- printf "%s-coordinator" (include "loader.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "loader.workerName" -}}
{{- printf "%s-worker" (include "loader.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "loader.trainerName" -}}
{{- printf "%s-trainer" (include "loader.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "loader.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "loader.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels. */}}
{{- define "loader.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "loader.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "loader.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loader.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "loader.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The coordinator's in-cluster gRPC URL, what workers and trainers dial. */}}
{{- define "loader.coordinatorUrl" -}}
{{- printf "http://%s.%s.svc:%d" (include "loader.coordinatorName" .) .Release.Namespace (int .Values.coordinator.port) }}
{{- end }}

{{/* host:port (KEDA's scalerAddress takes no scheme). */}}
{{- define "loader.coordinatorHostPort" -}}
{{- printf "%s.%s.svc:%d" (include "loader.coordinatorName" .) .Release.Namespace (int .Values.coordinator.port) }}
{{- end }}

{{- define "loader.listen" -}}
{{- $addr := .addr -}}
{{- if contains ":" $addr }}{{ printf "[%s]:%d" $addr (int .port) }}{{ else }}{{ printf "%s:%d" $addr (int .port) }}{{ end }}
{{- end }}

{{/* Environment every Loader container gets: log filter and telemetry. */}}
{{- define "loader.commonEnv" -}}
{{- with .Values.logLevel }}
- name: RUST_LOG
  value: {{ . | quote }}
{{- end }}
{{- with .Values.telemetry.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.telemetry.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with .Values.telemetry.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- range $name, $value := .Values.telemetry.extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{/*
The environment of a loader-worker (remote or sidecar): `cfg` is
.Values.workers or .Values.sidecar. The binary reads LOADER_COORDINATOR,
LOADER_LISTEN, LOADER_ADVERTISE, LOADER_NODE, LOADER_MEMORY_BUDGET and
LOADER_METRICS_LISTEN (worker/src/cli.rs).
*/}}
{{- define "loader.workerEnv" -}}
{{- $root := .root -}}
{{- $cfg := .cfg -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: LOADER_COORDINATOR
  value: {{ include "loader.coordinatorUrl" $root | quote }}
- name: LOADER_LISTEN
  value: {{ include "loader.listen" (dict "addr" $root.Values.bindAddress "port" $cfg.port) | quote }}
- name: LOADER_ADVERTISE
  value: {{ printf "http://$(POD_IP):%d" (int $cfg.port) | quote }}
{{- if eq $cfg.nodeIdentity "nodeName" }}
- name: LOADER_NODE
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
{{- with $cfg.memoryBudget }}
- name: LOADER_MEMORY_BUDGET
  value: {{ . | quote }}
{{- end }}
{{- if $root.Values.metrics.enabled }}
- name: LOADER_METRICS_LISTEN
  value: {{ include "loader.listen" (dict "addr" $root.Values.bindAddress "port" (default $root.Values.metrics.port $cfg.metricsPort)) | quote }}
{{- end }}
{{- include "loader.commonEnv" $root }}
{{- with $cfg.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A loader-worker's flags that have no environment variable. */}}
{{- define "loader.workerArgs" -}}
- {{ printf "--connect-timeout=%v" .connectTimeoutSeconds | quote }}
{{- if not (kindIs "invalid" .maxOutstanding) }}
- {{ printf "--max-outstanding=%d" (int .maxOutstanding) | quote }}
{{- end }}
{{- range .extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* gRPC health probes (grpc.health.v1, served on every Loader gRPC port). */}}
{{- define "loader.grpcProbe" -}}
grpc:
  port: {{ .port }}
periodSeconds: {{ .periodSeconds }}
failureThreshold: {{ .failureThreshold }}
{{- end }}

{{/*
The worker sidecar container for a trainer pod. Include it in your own pod
spec's initContainers (sidecar.native: true) or containers, with the volume
from "loader.ringVolume":
  initContainers:
    {{- include "loader.sidecarContainer" . | nindent 4 }}
*/}}
{{- define "loader.sidecarContainer" -}}
- name: loader-worker
  image: {{ include "loader.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  command: ["loader-worker"]
  args:
    {{- include "loader.workerArgs" .Values.sidecar | nindent 4 }}
  env:
    {{- include "loader.workerEnv" (dict "root" . "cfg" .Values.sidecar) | nindent 4 }}
  ports:
    - name: worker-grpc
      containerPort: {{ .Values.sidecar.port }}
      protocol: TCP
    {{- if .Values.metrics.enabled }}
    - name: worker-metrics
      containerPort: {{ .Values.sidecar.metricsPort }}
      protocol: TCP
    {{- end }}
  {{- if .Values.sidecar.native }}
  startupProbe:
    grpc:
      port: {{ .Values.sidecar.port }}
    periodSeconds: 2
    failureThreshold: 30
  {{- end }}
  readinessProbe:
    grpc:
      port: {{ .Values.sidecar.port }}
    periodSeconds: 10
  livenessProbe:
    grpc:
      port: {{ .Values.sidecar.port }}
    periodSeconds: 10
    failureThreshold: 3
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  volumeMounts:
    - name: loader-ring
      mountPath: {{ .Values.sidecar.ringDir }}
    - name: loader-worker-tmp
      mountPath: /tmp
    {{- with .Values.sidecar.volumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* The volumes the sidecar needs: the ring's directory and its /tmp. */}}
{{- define "loader.ringVolume" -}}
- name: loader-ring
  emptyDir:
    {{- with .Values.sidecar.ringMedium }}
    medium: {{ . }}
    {{- end }}
    sizeLimit: 16Mi
- name: loader-worker-tmp
  emptyDir: {}
{{- end }}

{{/* The coordinator's environment (may be empty). */}}
{{- define "loader.coordinatorEnv" -}}
{{- if eq .Values.scaling.backend "kubernetes" }}
# The coordinator's worker pool (`--worker-pool kubernetes`): which
# Deployment holds the remote workers, in which namespace.
- name: LOADER_WORKER_POOL
  value: "kubernetes"
- name: LOADER_WORKER_DEPLOYMENT
  value: {{ include "loader.workerName" . | quote }}
- name: LOADER_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
{{- include "loader.commonEnv" . }}
{{- with .Values.coordinator.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
