{{/* Chart name, overridable with nameOverride. */}}
{{- define "antler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, plus the chart name unless the release already contains it.
     Kept short enough (50) that "<fullname>-sandbox-pods" still fits a 63-character name. */}}
{{- define "antler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "antler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "antler.labels" -}}
helm.sh/chart: {{ include "antler.chart" . }}
{{ include "antler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels shared by every pod of the release (no component). */}}
{{- define "antler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "antler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component's objects. Call with (dict "root" $ "component" "runs"). */}}
{{- define "antler.componentLabels" -}}
{{ include "antler.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels that select one component's pods. Call with (dict "root" $ "component" "runs"). */}}
{{- define "antler.componentSelector" -}}
{{ include "antler.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Name of a component's objects: the public entry point (runs in split mode, the whole server in
     all-in-one) keeps the plain release name, so clients and NOTES address the same Service in both modes. */}}
{{- define "antler.componentName" -}}
{{- if or (eq .component "runs") (eq .component "antler") }}
{{- include "antler.fullname" .root }}
{{- else }}
{{- printf "%s-%s" (include "antler.fullname" .root) .component }}
{{- end }}
{{- end }}

{{/* The in-cluster DNS name of a component's Service: what its certificate must name. */}}
{{- define "antler.serviceHost" -}}
{{- printf "%s.%s.svc" (include "antler.componentName" .) .root.Release.Namespace }}
{{- end }}

{{/* The in-cluster address of a component's Service, as the other services' clients dial it. */}}
{{- define "antler.endpoint" -}}
{{- printf "%s://%s:%d" (ternary "https" "http" .root.Values.tls.enabled) (include "antler.serviceHost" .) (int .root.Values.port) }}
{{- end }}

{{/* Where the TLS Secret's files are in every pod. */}}
{{- define "antler.tlsDir" -}}/etc/antler-tls{{- end }}

{{/* The port the probes ask: the plaintext health-only listener when TLS is on (Kubernetes' gRPC probes do
     not speak TLS), else the gRPC port itself. */}}
{{- define "antler.probePort" -}}
{{- if .Values.tls.enabled }}{{ .Values.tls.healthPort }}{{ else }}{{ .Values.port }}{{ end }}
{{- end }}

{{/* Name of the Secret holding the API key and the service key. */}}
{{- define "antler.apiKeySecretName" -}}
{{- if .Values.apiKey.create }}
{{- include "antler.fullname" . }}
{{- else }}
{{- required "apiKey.existingSecret is required when apiKey.create is false" .Values.apiKey.existingSecret }}
{{- end }}
{{- end }}

{{/* True (non-empty) when the runs service uses PostgreSQL. */}}
{{- define "antler.hasDatabase" -}}
{{- if or .Values.database.url .Values.database.existingSecret }}true{{- end }}
{{- end }}

{{/* The Secret and key holding the database URL. */}}
{{- define "antler.databaseSecretName" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else }}
{{- printf "%s-database" (include "antler.fullname" .) }}
{{- end }}
{{- end }}

{{/* Container image reference. */}}
{{- define "antler.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* ServiceAccount name. */}}
{{- define "antler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "antler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The refusals: settings that would render a broken install. Included by every workload template. */}}
{{- define "antler.validate" -}}
{{- $db := include "antler.hasDatabase" . }}
{{- if and .Values.database.url (not (regexMatch "^postgres(ql)?://" .Values.database.url)) }}
{{- fail "database.url must be a postgres:// (or postgresql://) URL; leave it empty for SQLite in the data volume" }}
{{- end }}
{{- if eq .Values.mode "split" }}
{{- $runsMax := int .Values.runs.replicas }}
{{- if .Values.runs.autoscaling.enabled }}{{- $runsMax = int .Values.runs.autoscaling.maxReplicas }}{{- end }}
{{- if and (gt $runsMax 1) (not $db) }}
{{- fail (printf "runs.replicas (or runs.autoscaling.maxReplicas) is %d, but several runs replicas need PostgreSQL: each would keep its own SQLite database. Set database.existingSecret (a Secret whose key database.secretKey holds a postgres:// URL) or database.url, or keep runs.replicas at 1." $runsMax) }}
{{- end }}
{{- end }}
{{- if .Values.edge.enabled }}
{{- $edgePort := int .Values.edge.port }}
{{- if or (eq $edgePort (int .Values.port)) (and .Values.metrics.enabled (eq $edgePort (int .Values.metrics.port))) (and .Values.tls.enabled (eq $edgePort (int .Values.tls.healthPort))) }}
{{- fail (printf "edge.port (%d) must differ from port, metrics.port and tls.healthPort: the edge's HTTP listener is a port of its own" $edgePort) }}
{{- end }}
{{- if and (gt (len .Values.edge.corsOrigins) 1) (has "*" .Values.edge.corsOrigins) }}
{{- fail "edge.corsOrigins: \"*\" allows every origin; list it alone" }}
{{- end }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled is true but tls.secretName is empty: name a kubernetes.io/tls Secret (tls.crt, tls.key and ca.crt, e.g. from cert-manager)" }}
{{- end }}
{{- if and .Values.tls.enabled (or (eq (int .Values.tls.healthPort) (int .Values.port)) (and .Values.metrics.enabled (eq (int .Values.tls.healthPort) (int .Values.metrics.port)))) }}
{{- fail (printf "tls.healthPort (%d) must differ from port and metrics.port: it is a separate plaintext listener for the probes" (int .Values.tls.healthPort)) }}
{{- end }}
{{- end }}

{{/* Environment every Antler container gets: the API key, the services' own key, and the database URL where
     a service stores data in it. Call with (dict "root" $ "database" true). */}}
{{- define "antler.env" -}}
- name: ANTLER_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "antler.apiKeySecretName" .root }}
      key: {{ .root.Values.apiKey.secretKey }}
- name: ANTLER_SERVICE_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "antler.apiKeySecretName" .root }}
      key: {{ .root.Values.apiKey.serviceSecretKey }}
{{- if and .database (include "antler.hasDatabase" .root) }}
- name: ANTLER_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "antler.databaseSecretName" .root }}
      key: {{ .root.Values.database.secretKey }}
{{- end }}
{{- with .root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The generated antler.yaml: listen address, auth with both keys, every client wired to its Service (split)
     or to this process (all-in-one), the database URL by reference; then .Values.config merged over it.
     server.metrics when metrics.enabled; with tls.enabled, server.tls from the mounted Secret, the plaintext
     health-only listener the probes use, and (split) each client's https endpoint with the CA and the Service
     name its certificate must carry (and the client pair with tls.mutual).
     Call with (dict "root" $ "database" true|false): every process resolves every $VAR in the file, so the pods
     that do not get ANTLER_DATABASE_URL (sandbox, models, mcp) get a file without the reference. */}}
{{- define "antler.config" -}}
{{- $root := .root }}
{{- $withDatabase := .database }}
{{- $clients := dict }}
{{- $tlsDir := include "antler.tlsDir" $root }}
{{- range $component := list "runs" "sandbox" "mcp" "models" "memory" }}
{{- $client := dict "service_token" "$ANTLER_SERVICE_KEY" }}
{{- if eq $root.Values.mode "split" }}
{{- $ctx := dict "root" $root "component" $component }}
{{- $_ := set $client "endpoint" (include "antler.endpoint" $ctx) }}
{{- if $root.Values.tls.enabled }}
{{- $tls := dict "ca" (printf "%s/ca.crt" $tlsDir) "server_name" (include "antler.serviceHost" $ctx) }}
{{- if $root.Values.tls.mutual }}
{{- $_ := set $tls "cert" (printf "%s/tls.crt" $tlsDir) }}
{{- $_ := set $tls "key" (printf "%s/tls.key" $tlsDir) }}
{{- end }}
{{- $_ := set $client "tls" $tls }}
{{- end }}
{{- end }}
{{- $_ := set $clients $component $client }}
{{- end }}
{{- $server := dict
  "listen" (printf "0.0.0.0:%d" (int $root.Values.port))
  "auth" (dict
    "enabled" true
    "api_keys" (list
      (dict "key" "$ANTLER_API_KEY" "user" $root.Values.apiKey.user)
      (dict "key" "$ANTLER_SERVICE_KEY" "user" "antler-internal" "service" true)))
  "log" (dict "format" "json" "filter" "info,sqlx=warn") }}
{{- if $root.Values.metrics.enabled }}
{{- $_ := set $server "metrics" (dict "listen" (printf "0.0.0.0:%d" (int $root.Values.metrics.port))) }}
{{- end }}
{{- if $root.Values.tls.enabled }}
{{- /* In all-in-one mode the in-process clients follow the server (and, with client_ca, present its pair). */}}
{{- $serverTls := dict "cert" (printf "%s/tls.crt" $tlsDir) "key" (printf "%s/tls.key" $tlsDir) "required" true }}
{{- if $root.Values.tls.mutual }}
{{- $_ := set $serverTls "client_ca" (printf "%s/ca.crt" $tlsDir) }}
{{- end }}
{{- $_ := set $server "tls" $serverTls }}
{{- $_ := set $server "health_listen" (printf "0.0.0.0:%d" (int $root.Values.tls.healthPort)) }}
{{- end }}
{{- $base := dict "server" $server "clients" $clients }}
{{- if $root.Values.edge.enabled }}
{{- /* The HTTP edge: served by the edge pods (split) or by `antler up` (all-in-one); other pods ignore it. */}}
{{- $_ := set $base "edge" (dict "listen" (printf "0.0.0.0:%d" (int $root.Values.edge.port)) "cors_origins" $root.Values.edge.corsOrigins) }}
{{- end }}
{{- if and $withDatabase (include "antler.hasDatabase" $root) }}
{{- $_ := set $base "runs" (dict "database" (dict "url" "$ANTLER_DATABASE_URL")) }}
{{- end }}
{{- toYaml (mergeOverwrite $base (deepCopy $root.Values.config)) }}
{{- end }}

{{/* Volumes for the config, TLS material and /tmp. */}}
{{/* Call with (dict "root" $ "database" true|false). */}}
{{- define "antler.commonVolumes" -}}
- name: config
  configMap:
    name: {{ include "antler.fullname" .root }}
    items:
      - key: {{ ternary "antler.yaml" "antler-no-database.yaml" .database }}
        path: antler.yaml
- name: tmp
  emptyDir:
    sizeLimit: {{ .root.Values.tmpSizeLimit }}
{{- if .root.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .root.Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "antler.commonMounts" -}}
- name: config
  mountPath: /etc/antler
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ include "antler.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* One component's pod spec. Call with (dict "root" $ "component" "runs" "values" .Values.runs
     "serve" "runs" "database" true "dataVolume" (dict ...) "sandbox" false "http" false); "http": the pod
     serves the HTTP edge (the edge's own pods, or the all-in-one pod with edge.enabled). */}}
{{- define "antler.podTemplate" -}}
{{- $root := .root }}
{{- $v := .values }}
metadata:
  annotations:
    checksum/config: {{ include "antler.config" (dict "root" $root "database" .database) | sha256sum }}
    {{- with $root.Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  labels:
    {{- include "antler.componentSelector" . | nindent 4 }}
    {{- with $root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  serviceAccountName: {{ include "antler.serviceAccountName" $root }}
  # No Antler service calls the Kubernetes API.
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
  {{- if and .sandbox $root.Values.sandbox.userNamespaces.enabled $root.Values.sandbox.userNamespaces.podUserNamespace }}
  # A pod user namespace (Kubernetes >= 1.33, a runtime and filesystem with idmap mounts): what makes
  # procMount: Unmasked allowed, and container root is not host root.
  hostUsers: false
  {{- end }}
  securityContext:
    {{- $podSecurity := deepCopy $root.Values.podSecurityContext }}
    {{- if and .sandbox $root.Values.sandbox.userNamespaces.enabled }}
    {{- /* bwrap's unshare(CLONE_NEWUSER|…), mount and pivot_root are blocked by RuntimeDefault. */}}
    {{- $_ := set $podSecurity "seccompProfile" $root.Values.sandbox.userNamespaces.seccompProfile }}
    {{- with $root.Values.sandbox.userNamespaces.appArmorProfile }}
    {{- $_ := set $podSecurity "appArmorProfile" . }}
    {{- end }}
    {{- end }}
    {{- toYaml $podSecurity | nindent 4 }}
  containers:
    - name: {{ .component }}
      image: {{ include "antler.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: ["antler"]
      {{- if eq .serve "up" }}
      args: ["up", "--config", "/etc/antler/antler.yaml", "--data-dir", "/var/lib/antler"]
      {{- else }}
      args: ["serve", {{ .serve | quote }}, "--config", "/etc/antler/antler.yaml", "--data-dir", "/var/lib/antler"]
      {{- end }}
      env:
        {{- include "antler.env" (dict "root" $root "database" .database) | nindent 8 }}
      ports:
        - name: grpc
          containerPort: {{ $root.Values.port }}
          protocol: TCP
        {{- if $root.Values.metrics.enabled }}
        - name: metrics
          containerPort: {{ $root.Values.metrics.port }}
          protocol: TCP
        {{- end }}
        {{- if $root.Values.tls.enabled }}
        - name: health
          containerPort: {{ $root.Values.tls.healthPort }}
          protocol: TCP
        {{- end }}
        {{- if .http }}
        # The HTTP edge (edge.listen): the LangGraph API and DeerFlow's gateway routes, plain HTTP.
        - name: http
          containerPort: {{ $root.Values.edge.port }}
          protocol: TCP
        {{- end }}
      # grpc.health.v1.Health needs no token; a draining server reports NOT_SERVING, so readiness drops
      # before the port closes. The startup probe covers migrations and the sandbox's bwrap probe. With TLS
      # on they ask the plaintext health-only listener (same statuses): the kubelet's gRPC probe has no TLS.
      startupProbe:
        grpc:
          port: {{ include "antler.probePort" $root }}
          service: {{ .health | quote }}
        {{- toYaml $root.Values.probes.startup | nindent 8 }}
      livenessProbe:
        grpc:
          port: {{ include "antler.probePort" $root }}
        {{- toYaml $root.Values.probes.liveness | nindent 8 }}
      readinessProbe:
        grpc:
          port: {{ include "antler.probePort" $root }}
          service: {{ .health | quote }}
        {{- toYaml $root.Values.probes.readiness | nindent 8 }}
      securityContext:
        {{- $security := deepCopy $root.Values.securityContext }}
        {{- if and .sandbox $root.Values.sandbox.userNamespaces.enabled $root.Values.sandbox.userNamespaces.podUserNamespace }}
        {{- /* bwrap mounts a fresh /proc in its pid namespace; the kernel refuses that while the container's
               /proc has masked sub-paths ("mount too revealing"). */}}
        {{- $_ := set $security "procMount" "Unmasked" }}
        {{- end }}
        {{- toYaml $security | nindent 8 }}
      resources:
        {{- toYaml $v.resources | nindent 8 }}
      volumeMounts:
        {{- include "antler.commonMounts" $root | nindent 8 }}
        - name: data
          mountPath: /var/lib/antler
  volumes:
    {{- include "antler.commonVolumes" (dict "root" $root "database" .database) | nindent 4 }}
    {{- with .dataVolume }}
    - name: data
      {{- toYaml . | nindent 6 }}
    {{- end }}
  {{- with (default $root.Values.nodeSelector $v.nodeSelector) }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (default $root.Values.affinity $v.affinity) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (default $root.Values.tolerations $v.tolerations) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
