{{/* Names. The release "nezha" gives nezha-cache, nezha-cache-peers, ... as DESIGN.md names them. */}}
{{- define "nezha.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nezha.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "nezha.cache" -}}{{ include "nezha.fullname" . }}-cache{{- end }}
{{- define "nezha.peers" -}}{{ include "nezha.fullname" . }}-cache-peers{{- end }}
{{- define "nezha.controller" -}}{{ include "nezha.fullname" . }}-controller{{- end }}
{{- define "nezha.webhook" -}}{{ include "nezha.fullname" . }}-webhook{{- end }}
{{- define "nezha.certs" -}}{{ include "nezha.fullname" . }}-webhook-certs{{- end }}
{{- define "nezha.ca" -}}{{ include "nezha.fullname" . }}-ca{{- end }}
{{- define "nezha.redis" -}}{{ include "nezha.fullname" . }}-redis{{- end }}

{{- define "nezha.clusterTokenSecret" -}}
{{- .Values.cache.clusterTokenSecret | default (printf "%s-cluster-token" (include "nezha.fullname" .)) }}
{{- end }}

{{- define "nezha.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "nezha.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nezha
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "cache"). Never change them: selectors are immutable. */}}
{{- define "nezha.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nezha.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "nezha.componentLabels" -}}
{{ include "nezha.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "nezha.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Restricted Pod Security: non-root, no privilege escalation, no capabilities, RuntimeDefault seccomp. */}}
{{- define "nezha.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid | default 10001 }}
runAsGroup: {{ .uid | default 10001 }}
fsGroup: {{ .uid | default 10001 }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "nezha.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{- define "nezha.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}

{{/*
The index's URL as NEZHA_REDIS_URL, the password spliced in from its Secret
with Kubernetes' $(VAR) expansion, so it is never in the pod spec. A password
must be URL-safe (the chart's own is alphanumeric).
*/}}
{{- define "nezha.redisEnv" -}}
{{- if .Values.redis.external.url }}
{{- if .Values.redis.external.passwordSecret.name }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.external.passwordSecret.name }}
      key: {{ .Values.redis.external.passwordSecret.key }}
- name: NEZHA_REDIS_URL
  value: {{ regexReplaceAll "^(rediss?|redis\\+sentinel)://" .Values.redis.external.url "${1}://:$$(REDIS_PASSWORD)@" | quote }}
{{- else }}
- name: NEZHA_REDIS_URL
  value: {{ .Values.redis.external.url | quote }}
{{- end }}
{{- else }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "nezha.redisSecret" . }}
      key: password
- name: NEZHA_REDIS_URL
  value: "redis://:$(REDIS_PASSWORD)@{{ include "nezha.redis" . }}.{{ .Release.Namespace }}.svc:6379/0"
{{- end }}
{{- end }}

{{- define "nezha.redisSecret" -}}
{{- .Values.redis.passwordSecret | default (include "nezha.redis" .) }}
{{- end }}

{{/* A random secret value made once: the live Secret's value when there is one, so upgrades keep it. */}}
{{- define "nezha.keptSecret" -}}
{{- $live := lookup "v1" "Secret" .ctx.Release.Namespace .name }}
{{- if and $live $live.data (hasKey $live.data .key) }}
{{- index $live.data .key }}
{{- else }}
{{- randAlphaNum 40 | b64enc }}
{{- end }}
{{- end }}

{{/* What values.schema.json cannot say (one field against another), refused with the fields named. */}}
{{- define "nezha.validate" -}}
{{- $a := .Values.cache.autoscale }}
{{- if gt (int $a.minReplicas) (int $a.maxReplicas) }}
{{- fail (printf "cache.autoscale.minReplicas (%d) must not exceed cache.autoscale.maxReplicas (%d)" (int $a.minReplicas) (int $a.maxReplicas)) }}
{{- end }}
{{- if ge (int .Values.webhook.certs.renewDays) (int .Values.webhook.certs.days) }}
{{- fail (printf "webhook.certs.renewDays (%d) must be less than webhook.certs.days (%d): every certificate would be renewed at once" (int .Values.webhook.certs.renewDays) (int .Values.webhook.certs.days)) }}
{{- end }}
{{- if and .Values.redis.external.passwordSecret.name (not .Values.redis.external.url) }}
{{- fail "redis.external.passwordSecret.name is set but redis.external.url is empty: name the Redis to use" }}
{{- end }}
{{- $hosts := list }}
{{- range .Values.origins }}
{{- if has (lower .host) $hosts }}
{{- fail (printf "origins: host %q is configured twice" .host) }}
{{- end }}
{{- $hosts = append $hosts (lower .host) }}
{{- end }}
{{- end }}
