{{/* Names. The release "nezha" gives nezha-cache, nezha-cache-peers, ... as the design brief (../shared/DESIGN.md, beside the repository) names them. */}}
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
{{- if .Values.redis.ha.enabled }}
{{- $name := include "nezha.redis" . }}
{{- $ns := .Release.Namespace }}
{{- $sentinels := list }}
{{- range $i := until (int .Values.redis.ha.replicas) }}
{{- $sentinels = append $sentinels (printf "%s-%d.%s-headless.%s.svc:26379" $name $i $name $ns) }}
{{- end }}
- name: NEZHA_REDIS_URL
  value: "redis+sentinel://:$(REDIS_PASSWORD)@{{ join "," $sentinels }}/{{ include "nezha.redisHA.master" . }}/0?sentinel_password=$(REDIS_PASSWORD)"
{{- else }}
- name: NEZHA_REDIS_URL
  value: "redis://:$(REDIS_PASSWORD)@{{ include "nezha.redis" . }}.{{ .Release.Namespace }}.svc:6379/0"
{{- end }}
{{- end }}
{{- end }}

{{/* The master's name in the Sentinels of the chart's HA index. */}}
{{- define "nezha.redisHA.master" -}}nezha{{- end }}

{{/* What both containers of an HA index pod know: who they are, the password, the Sentinels' master name. */}}
{{- define "nezha.redisHA.env" -}}
{{ include "nezha.podEnv" . }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "nezha.redisSecret" . }}
      key: password
- name: SENTINEL_MASTER
  value: {{ include "nezha.redisHA.master" . }}
- name: STATEFULSET
  value: {{ include "nezha.redis" . }}
- name: HEADLESS
  value: {{ include "nezha.redis" . }}-headless
- name: REPLICAS
  value: {{ .Values.redis.ha.replicas | quote }}
{{- end }}

{{/*
Shell: sets $self (this pod's stable name) and $master (the name of the
master): what another pod's Sentinel says it is, else pod 0 (a first start,
or every Sentinel down). A pod restarted after a failover so comes back as
a replica of the promoted one, never as a second master.
*/}}
{{- define "nezha.redisHA.findMaster" -}}
svc="$HEADLESS.$POD_NAMESPACE.svc"
self="$POD_NAME.$svc"
master=""
i=0
while [ "$i" -lt "$REPLICAS" ]; do
  peer="$STATEFULSET-$i.$svc"
  i=$((i + 1))
  [ "$peer" = "$self" ] && continue
  master=$(redis-cli -h "$peer" -p 26379 --no-auth-warning -a "$REDIS_PASSWORD" \
    SENTINEL get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null | head -n 1) || master=""
  [ -n "$master" ] && break
done
if [ -z "$master" ]; then master="$STATEFULSET-0.$svc"; fi
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
{{- $c := .Values.cache }}
{{- if eq (int $c.port) (int $c.tlsPort) }}
{{- fail (printf "cache.tlsPort (%d) must differ from cache.port (%d): a node listens on both" (int $c.tlsPort) (int $c.port)) }}
{{- end }}
{{- $capacity := include "nezha.bytes" (dict "value" $c.capacity "units" (include "nezha.sizeUnits" . | fromYaml) "fold" true) | float64 }}
{{- $disk := include "nezha.bytes" (dict "value" $c.storage.size "units" (include "nezha.quantityUnits" . | fromYaml) "fold" false) | float64 }}
{{- /* Equal is refused too: the file system takes some of the volume, and a
download without Content-Length overruns the capacity in its temporary file
for a moment, so a node at capacity would find its disk full. */}}
{{- if ge $capacity $disk }}
{{- fail (printf "cache.capacity (%s = %.0f bytes) must be below cache.storage.size (%s = %.0f bytes): the file system takes some of the volume and a download can briefly pass the capacity, so a node would fill its disk before it evicts; leave headroom (the defaults leave a tenth: 45GiB of 50Gi)" (toString $c.capacity) $capacity (toString $c.storage.size) $disk) }}
{{- end }}
{{- $budget := $c.pdb.maxUnavailable }}
{{- if kindIs "string" $budget }}
{{- fail (printf "cache.pdb.maxUnavailable (%q) must be a number of nodes below cache.replicasPerKey (%d): a share of the nodes grows with the cluster until one drain can evict every owner of an object" $budget (int $c.replicasPerKey)) }}
{{- end }}
{{- /* With one owner per key no budget can keep a copy; 0 would only block every drain, so 1 is allowed. */}}
{{- if eq (int $c.replicasPerKey) 1 }}
{{- if gt (int $budget) 1 }}
{{- fail (printf "cache.pdb.maxUnavailable (%d) must be at most 1 with cache.replicasPerKey (1): a node drain could evict several nodes' objects at once" (int $budget)) }}
{{- end }}
{{- else if ge (int $budget) (int $c.replicasPerKey) }}
{{- fail (printf "cache.pdb.maxUnavailable (%d) must be below cache.replicasPerKey (%d): a node drain could evict every owner of an object at once" (int $budget) (int $c.replicasPerKey)) }}
{{- end }}
{{- if gt (int $c.replicasPerKey) (int $c.replicas) }}
{{- fail (printf "cache.replicasPerKey (%d) must not exceed cache.replicas (%d): a key cannot have more owners than there are cache nodes" (int $c.replicasPerKey) (int $c.replicas)) }}
{{- end }}
{{- $hosts := list }}
{{- range .Values.origins }}
{{- if has (lower .host) $hosts }}
{{- fail (printf "origins: host %q is configured twice" .host) }}
{{- end }}
{{- $hosts = append $hosts (lower .host) }}
{{- end }}
{{- end }}


{{/*
Bytes in a size, as a float: (dict "value" "45GiB" "units" (map of suffix to
bytes) "fold" true). fold: suffixes are case-insensitive and a trailing B is
dropped, as `nezha cache --capacity` reads them (nezha/config.py parse_size);
otherwise they are Kubernetes quantity suffixes, case and all. The schema has
checked the form already.
*/}}
{{- define "nezha.bytes" -}}
{{- $v := trim (toString .value) }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $v }}
{{- $unit := trim (trimPrefix $number $v) }}
{{- if .fold }}{{ $unit = lower $unit | trimSuffix "b" }}{{ end }}
{{- mulf (float64 $number) (index .units $unit) }}
{{- end }}

{{/* `--capacity` suffixes (after folding): K, M, G, T decimal; Ki, Mi, Gi, Ti binary. */}}
{{- define "nezha.sizeUnits" -}}
"": 1
k: 1000
m: 1000000
g: 1000000000
t: 1000000000000
ki: 1024
mi: 1048576
gi: 1073741824
ti: 1099511627776
{{- end }}

{{/* Kubernetes quantity suffixes values.schema.json allows for cache.storage.size. */}}
{{- define "nezha.quantityUnits" -}}
"": 1
k: 1000
M: 1000000
G: 1000000000
T: 1000000000000
P: 1000000000000000
E: 1000000000000000000
Ki: 1024
Mi: 1048576
Gi: 1073741824
Ti: 1099511627776
Pi: 1125899906842624
Ei: 1152921504606846976
{{- end }}

{{/*
The webhook's settings file (nezha/config.py WebhookSettings): what a sidecar
gets (docs/deployment-models.md). Its origins are the chart's, so a sidecar
that cannot reach the cluster fetches from the same upstreams the nodes do;
*.domain patterns are left out, as the default rule leaves them out.
*/}}
{{- define "nezha.webhookSettings" -}}
{{- $s := .Values.webhook.sidecar -}}
sidecar_image: {{ printf "%s:%s" ($s.image.repository | default .Values.image.repository) ($s.image.tag | default .Values.image.tag | default .Chart.AppVersion) | quote }}
sidecar_image_pull_policy: {{ $s.image.pullPolicy | quote }}
sidecar_size: {{ $s.size | quote }}
sidecar_by_annotation: {{ $s.byAnnotation }}
sidecar_resources:
{{- range $part, $amounts := $s.resources }}
  {{ $part }}:
{{- range $resource, $amount := $amounts }}
    {{ $resource }}: {{ $amount | toString | quote }}
{{- end }}
{{- end }}
sidecar_origins:
{{- range .Values.origins }}
{{- if not (hasPrefix "*." .host) }}
  {{ .host | quote }}: {{ .upstream | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Processes per cache node (`nezha cache --workers`, docs/cache-node.md
"Workers"): cache.workers when set, else the CPU limit rounded up (a pod
throttled to 2 CPUs gains nothing from a third worker), else 1: without a
limit the pod may be scheduled beside others, and each worker costs memory.
*/}}
{{- define "nezha.cacheWorkers" -}}
{{- $cpu := toString (dig "limits" "cpu" "" (.Values.cache.resources | default dict)) -}}
{{- if .Values.cache.workers -}}
{{- .Values.cache.workers -}}
{{- else if not $cpu -}}
1
{{- else if hasSuffix "m" $cpu -}}
{{- max 1 (div (add (trimSuffix "m" $cpu | atoi) 999) 1000) -}}
{{- else -}}
{{- max 1 (ceil (float64 $cpu) | int) -}}
{{- end -}}
{{- end -}}

{{/*
The origins (as a JSON list of hosts) passed through because no rule trusts
the CA for them: with https.terminate and rules of the user's own, a host
that no `tls: true` rule aliases is passed through (`tls: passthrough`): its
pods were not given the Nezha CA, and aliasing a host must never break its
HTTPS. The default rule is `tls: true` for every origin, so without rules of
the user's own the list is empty. An origin's own `tls` is its own and is not
listed. Read by cache-config.yaml (the nodes' table) and NOTES.txt.
*/}}
{{- define "nezha.passthroughByRules" -}}
{{- $out := list }}
{{- if and .Values.https.terminate .Values.webhook.rules }}
{{- $tlsHosts := list }}
{{- range .Values.webhook.rules }}
{{- if .tls }}
{{- range .hostAliases }}
{{- $tlsHosts = concat $tlsHosts (.hostnames | default list) }}
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.origins }}
{{- if not .tls }}
{{- $host := .host }}
{{- $covered := false }}
{{- range $tlsHosts }}
{{- if or (eq . $host) (and (hasPrefix "*." $host) (hasSuffix (trimPrefix "*" $host) .)) }}
{{- $covered = true }}
{{- end }}
{{- end }}
{{- if not $covered }}
{{- $out = append $out $host }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}
