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

{{/* The coordinator's in-cluster gRPC URL, what workers and trainers dial
(https:// with security.tls.enabled: the certificate names this host). */}}
{{- define "loader.coordinatorUrl" -}}
{{- printf "%s://%s.%s.svc:%d" (include "loader.scheme" .) (include "loader.coordinatorName" .) .Release.Namespace (int .Values.coordinator.port) }}
{{- end }}

{{- define "loader.scheme" -}}
{{- if .Values.security.tls.enabled }}https{{ else }}http{{ end }}
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
{{- if include "loader.advertiseDns" $root }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: LOADER_ADVERTISE
  value: {{ printf "https://$(POD_NAME).%s.%s.svc:%d" .subdomain $root.Release.Namespace (int $cfg.port) | quote }}
{{- else }}
- name: LOADER_ADVERTISE
  value: {{ printf "%s://$(POD_IP):%d" (include "loader.scheme" $root) (int $cfg.port) | quote }}
{{- end }}
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
{{- include "loader.securityEnv" (dict "root" $root "role" "worker") }}
{{- include "loader.storageEnv" $root }}
- name: LOADER_STORAGE_CACHE_DIR
  value: {{ include "loader.storageCacheDir" $root | quote }}
- name: LOADER_STORAGE_CACHE
  value: {{ $root.Values.objectStorage.cache.size | quote }}
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

{{/*
Health probes of a Loader gRPC port: native gRPC probes (grpc.health.v1,
served on every Loader gRPC port, no token needed) over plaintext; with
security.tls.enabled a tcpSocket probe, since the kubelet's gRPC probe
speaks no TLS (and could not present a client certificate). `root` is the
chart's context.
*/}}
{{- define "loader.probeHandler" -}}
{{- if .root.Values.security.tls.enabled -}}
tcpSocket:
  port: {{ .port }}
{{- else -}}
grpc:
  port: {{ .port }}
{{- end }}
{{- end }}

{{- define "loader.grpcProbe" -}}
{{ include "loader.probeHandler" . }}
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
    {{- include "loader.workerEnv" (dict "root" . "cfg" .Values.sidecar "subdomain" (include "loader.trainerName" .)) | nindent 4 }}
  {{- with include "loader.storageEnvFrom" . | trim }}
  {{- . | nindent 2 }}
  {{- end }}
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
    {{- include "loader.probeHandler" (dict "root" . "port" .Values.sidecar.port) | nindent 4 }}
    periodSeconds: 2
    failureThreshold: 30
  {{- end }}
  readinessProbe:
    {{- include "loader.probeHandler" (dict "root" . "port" .Values.sidecar.port) | nindent 4 }}
    periodSeconds: 10
  livenessProbe:
    {{- include "loader.probeHandler" (dict "root" . "port" .Values.sidecar.port) | nindent 4 }}
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
    - name: loader-storage-cache
      mountPath: {{ include "loader.storageCacheDir" . }}
    {{- with include "loader.securityMounts" (dict "root" . "prefix" "loader-worker") | trim }}{{ . | nindent 4 }}{{ end }}
    {{- with .Values.sidecar.volumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
The volumes the sidecar needs: the ring's directory and its /tmp, and with
security on its certificate and the worker and trainer tokens (volumes of
its own, which the trainer container does not mount).
*/}}
{{- define "loader.ringVolume" -}}
- name: loader-ring
  emptyDir:
    {{- with .Values.sidecar.ringMedium }}
    medium: {{ . }}
    {{- end }}
    sizeLimit: 16Mi
- name: loader-worker-tmp
  emptyDir: {}
{{ include "loader.storageCacheVolume" . }}
{{- include "loader.securityVolumes" (dict "root" . "role" "worker" "prefix" "loader-worker") }}
{{- end }}

{{/*
Object storage (docs/storage.md): the store's settings as the AWS SDKs
read them (may be empty), for every container that reads datasets.
*/}}
{{- define "loader.storageEnv" -}}
{{- with .Values.objectStorage.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.objectStorage.region }}
- name: AWS_REGION
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The store's credentials: the Secret's keys as environment (may be empty). */}}
{{- define "loader.storageEnvFrom" -}}
{{- with .Values.objectStorage.credentialsSecret }}
envFrom:
  - secretRef:
      name: {{ . }}
{{- end }}
{{- end }}

{{/* Where workers keep their local copy of objects. */}}
{{- define "loader.storageCacheDir" -}}
/var/cache/loader-storage
{{- end }}

{{/* The local copy's volume. */}}
{{- define "loader.storageCacheVolume" -}}
- name: loader-storage-cache
  emptyDir:
    {{- with .Values.objectStorage.cache.medium }}
    medium: {{ . }}
    {{- end }}
    sizeLimit: {{ .Values.objectStorage.cache.size }}
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
{{- include "loader.securityEnv" (dict "root" . "role" "coordinator") }}
{{- include "loader.commonEnv" . }}
{{- with .Values.coordinator.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Security (security.tls, security.tokens): what each role gets, as files
from Secrets mounted read-only, never a token on argv or in a plain env
value. Roles:
  coordinator  serves every role: its certificate, the client CA (mutual
               TLS), all three tokens;
  worker       remote worker or sidecar: serves trainers and calls the
               coordinator: its certificate (also its client certificate),
               the client CA, the CA to verify the coordinator with, the
               worker token (its own, and the session keys' secret) and the
               trainer token (it checks trainers' fetches);
  trainer      a client: the CA, a client certificate under mutual TLS, the
               trainer token;
  admin        loaderctl's admin commands (the helm test pod): the CA, a
               client certificate under mutual TLS, the admin token.
*/}}
{{- define "loader.tlsDir" -}}/etc/loader/tls{{- end }}
{{- define "loader.tokenDir" -}}/etc/loader/tokens{{- end }}

{{/* Whether workers advertise a per-pod DNS name (pod subdomain) instead of their IP. */}}
{{- define "loader.advertiseDns" -}}
{{- if and .Values.security.tls.enabled (eq .Values.security.tls.workerAddress "podDNS") }}true{{ end }}
{{- end }}

{{/* The TLS Secret of a role: security.tls.secretNames.<coordinator|worker|client>, else secretName. */}}
{{- define "loader.tlsSecretName" -}}
{{- $tls := .root.Values.security.tls -}}
{{- $key := ternary "client" .role (has .role (list "trainer" "admin")) -}}
{{- $name := default $tls.secretName (get $tls.secretNames $key) -}}
{{- required (printf "security.tls.enabled needs security.tls.secretName (or security.tls.secretNames.%s): a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt" $key) $name -}}
{{- end }}

{{- define "loader.tokensSecretName" -}}
{{- default (printf "%s-tokens" (include "loader.fullname" .)) .Values.security.tokens.secretName }}
{{- end }}

{{/* The token roles a role holds. */}}
{{- define "loader.tokenRoles" -}}
{{- if eq .role "coordinator" }}worker trainer admin
{{- else if eq .role "worker" }}worker trainer
{{- else }}{{ .role }}
{{- end }}
{{- end }}

{{/* Whether a role presents a certificate: servers always, clients under mutual TLS. */}}
{{- define "loader.hasCert" -}}
{{- if or (has .role (list "coordinator" "worker")) .root.Values.security.tls.clientAuth }}true{{ end }}
{{- end }}

{{/* The environment of a role's security files (may be empty). */}}
{{- define "loader.securityEnv" -}}
{{- $root := .root -}}
{{- $sec := $root.Values.security -}}
{{- if $sec.tls.enabled }}
{{- if include "loader.hasCert" . }}
- name: LOADER_TLS_CERT
  value: {{ printf "%s/tls.crt" (include "loader.tlsDir" .) | quote }}
- name: LOADER_TLS_KEY
  value: {{ printf "%s/tls.key" (include "loader.tlsDir" .) | quote }}
{{- end }}
{{- if and $sec.tls.clientAuth (has .role (list "coordinator" "worker")) }}
- name: LOADER_TLS_CLIENT_CA
  value: {{ printf "%s/ca.crt" (include "loader.tlsDir" .) | quote }}
{{- end }}
{{- if ne .role "coordinator" }}
- name: LOADER_TLS_CA
  value: {{ printf "%s/ca.crt" (include "loader.tlsDir" .) | quote }}
{{- end }}
{{- end }}
{{- if $sec.tokens.enabled }}
{{- range splitList " " (include "loader.tokenRoles" .) }}
- name: {{ printf "LOADER_%s_TOKEN_FILE" (upper .) }}
  value: {{ printf "%s/%s" (include "loader.tokenDir" $) . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* A role's security volumes (may be empty); `prefix` names them. */}}
{{- define "loader.securityVolumes" -}}
{{- $root := .root -}}
{{- $sec := $root.Values.security -}}
{{- if $sec.tls.enabled }}
- name: {{ .prefix }}-tls
  secret:
    secretName: {{ include "loader.tlsSecretName" . }}
    defaultMode: 288 # 0440: root-owned, readable by the pod's fsGroup
    items:
      {{- if include "loader.hasCert" . }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- if $sec.tokens.enabled }}
- name: {{ .prefix }}-tokens
  secret:
    secretName: {{ include "loader.tokensSecretName" $root }}
    defaultMode: 288 # 0440: root-owned, readable by the pod's fsGroup
    items:
      {{- range splitList " " (include "loader.tokenRoles" .) }}
      - key: {{ . }}
        path: {{ . }}
      {{- end }}
{{- end }}
{{- end }}

{{/* The mounts of a role's security volumes (may be empty): whole directories, never subPath, so that a renewed certificate reaches the files. */}}
{{- define "loader.securityMounts" -}}
{{- $sec := .root.Values.security -}}
{{- if $sec.tls.enabled }}
- name: {{ .prefix }}-tls
  mountPath: {{ include "loader.tlsDir" . }}
  readOnly: true
{{- end }}
{{- if $sec.tokens.enabled }}
- name: {{ .prefix }}-tokens
  mountPath: {{ include "loader.tokenDir" . }}
  readOnly: true
{{- end }}
{{- end }}
