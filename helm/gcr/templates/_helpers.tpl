{{/* Names and labels shared by the chart's templates. */}}

{{- define "gcr.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-gcr, or the release name if it already holds the chart name. */}}
{{- define "gcr.fullname" -}}
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

{{- define "gcr.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gcr.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "gcr.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "gcr.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gcr.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gcr.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gcr.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The scaler (Deployment, role scaler): its own name, labels and ServiceAccount. */}}
{{- define "gcr.scalerName" -}}
{{- printf "%s-scaler" (include "gcr.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gcr.scalerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gcr.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scaler
{{- end }}

{{- define "gcr.scalerLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "gcr.scalerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gcr.scalerServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gcr.scalerName" .) .Values.serviceAccount.scalerName }}
{{- else }}
{{- required "serviceAccount.scalerName is required when serviceAccount.create is false" .Values.serviceAccount.scalerName }}
{{- end }}
{{- end }}

{{/* --metrics-address: the pod's own IP (env POD_IP, expanded by the kubelet) in brackets,
which the agent reads as either family; or the override, bracketed when it is IPv6. */}}
{{- define "gcr.metricsAddress" -}}
{{- $a := .Values.metrics.bindAddress }}
{{- if not $a }}
{{- printf "[$(POD_IP)]:%d" (int .Values.metrics.port) }}
{{- else if contains ":" $a }}
{{- printf "[%s]:%d" $a (int .Values.metrics.port) }}
{{- else }}
{{- printf "%s:%d" $a (int .Values.metrics.port) }}
{{- end }}
{{- end }}
