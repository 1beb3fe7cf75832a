{{/* Chart name, overridable with nameOverride. */}}
{{- define "antler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, plus the chart name unless the release already contains it. */}}
{{- define "antler.fullname" -}}
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

{{/* Labels that select the pods. */}}
{{- define "antler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "antler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Name of the Secret holding the API key. */}}
{{- define "antler.apiKeySecretName" -}}
{{- if .Values.apiKey.create }}
{{- include "antler.fullname" . }}
{{- else }}
{{- required "apiKey.existingSecret is required when apiKey.create is false" .Values.apiKey.existingSecret }}
{{- end }}
{{- end }}

{{/* Container image reference. */}}
{{- define "antler.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
