{{/* The chart's name. */}}
{{- define "continuum-router.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' base name: the release's name when it contains the chart's (a release named
`continuum-router` gives the names of deploy/kubernetes/), else `<release>-<chart>`.
*/}}
{{- define "continuum-router.fullname" -}}
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

{{- define "continuum-router.selectorLabels" -}}
app.kubernetes.io/name: {{ include "continuum-router.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "continuum-router.labels" -}}
{{ include "continuum-router.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The fleet's namespace: where the discovery Role and RoleBinding go. */}}
{{- define "continuum-router.fleetNamespace" -}}
{{- default .Release.Namespace .Values.dynamoPodDiscovery.namespace }}
{{- end }}

{{/* Discovery is on (and `metadata` is refused without it). */}}
{{- define "continuum-router.discovery" -}}
{{- if and .Values.dynamoPodDiscovery.metadata (not .Values.dynamoPodDiscovery.enabled) }}
{{- fail "dynamoPodDiscovery.metadata needs dynamoPodDiscovery.enabled: true" }}
{{- end }}
{{- if .Values.dynamoPodDiscovery.enabled }}true{{ end }}
{{- end }}
