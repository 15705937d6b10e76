{{/* Names, labels and shared snippets of the headstart chart. */}}

{{- define "headstart.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "headstart.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; call with (dict "root" $ "component" "gateway"). */}}
{{- define "headstart.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: headstart
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "headstart.selectorLabels" . }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels that select one component's pods. */}}
{{- define "headstart.selectorLabels" -}}
app.kubernetes.io/name: {{ include "headstart.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* image: a component's override or the global one; call with (dict "root" $ "image" .Values.gateway.image). */}}
{{- define "headstart.image" -}}
{{- $repo := default .root.Values.image.repository .image.repository -}}
{{- if not $repo -}}
{{- fail "image.repository is required: the registry path you pushed the headstart image to (docker build --build-context shared=../shared -t REGISTRY/headstart:0.1.0 . && docker push REGISTRY/headstart:0.1.0; then --set image.repository=REGISTRY/headstart)" -}}
{{- end -}}
{{- $tag := default (default .root.Chart.AppVersion .root.Values.image.tag) .image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{- define "headstart.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end -}}

{{- define "headstart.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end -}}

{{/* Ray writes its session files and logs beside its install: a writable root, the rest as strict. */}}
{{- define "headstart.rayContainerSecurityContext" -}}
{{ toYaml (merge (dict "readOnlyRootFilesystem" false) (deepCopy .Values.containerSecurityContext)) }}
{{- end -}}

{{/* Secret (name) and key that hold the Redis URL used by the engine and the table-cache service. */}}
{{- define "headstart.redisUrlSecret" -}}
{{- if and .Values.redis.enabled .Values.redis.auth.existingSecret -}}
{{ .Values.redis.auth.existingSecret }}
{{- else if .Values.redis.enabled -}}
{{ include "headstart.fullname" . }}-redis
{{- else if .Values.redis.external.existingSecret -}}
{{ .Values.redis.external.existingSecret }}
{{- else -}}
{{ include "headstart.fullname" . }}-redis-external
{{- end -}}
{{- end -}}

{{- define "headstart.redisConfigured" -}}
{{- if or .Values.redis.enabled .Values.redis.external.url .Values.redis.external.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* The model the engine and the table-cache service load. */}}
{{- define "headstart.modelPath" -}}
{{- if eq .Values.model.source "pvc" -}}
{{- printf "/models/%s" (trimPrefix "/" .Values.model.pvc.path) -}}
{{- else -}}
{{- .Values.model.id -}}
{{- end -}}
{{- end -}}

{{/* The model cache's claim (values model.cache): an existing one, or the chart's. */}}
{{- define "headstart.modelCacheClaim" -}}
{{- default (printf "%s-model-cache" (include "headstart.fullname" .)) .Values.model.cache.existingClaim -}}
{{- end -}}

{{/* Volumes for the model (PVC or hub cache) and a writable /tmp; call with the root context.
     The hub cache is a PersistentVolumeClaim (model.cache), so a restarted pod reads the
     model it downloaded before instead of downloading it again. */}}
{{- define "headstart.modelVolumes" -}}
- name: tmp
  emptyDir: {}
- name: model-cache
{{- if .Values.model.cache.enabled }}
  persistentVolumeClaim:
    claimName: {{ include "headstart.modelCacheClaim" . }}
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.model.cache.emptyDirSizeLimit }}
{{- end }}
{{- if eq .Values.model.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.pvc.claimName }}
    readOnly: true
{{- end }}
{{- end -}}

{{- define "headstart.modelVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: model-cache
  mountPath: /cache
{{- if eq .Values.model.source "pvc" }}
- name: model
  mountPath: /models
  readOnly: true
{{- end }}
{{- end -}}

{{/* Environment of processes that load the model and read/write table blocks (engine, table cache). */}}
{{/*
Ray's raylet starts worker processes (the engine replicas) at niceness 15: a
replica would yield the CPU to every normal-priority process on its node and
its data sessions fall behind. The replica is the serving work: niceness 0.
*/}}
{{- define "headstart.rayWorkerPriorityEnv" -}}
- name: RAY_worker_niceness
  value: "0"
{{- end }}

{{- define "headstart.modelEnv" -}}
- name: HF_HOME
  value: /cache/huggingface
- name: HEADSTART_HOME
  value: /tmp/headstart
{{- if .Values.model.hfToken.secretName }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.model.hfToken.secretName }}
      key: {{ .Values.model.hfToken.secretKey }}
{{- end }}
{{- if include "headstart.redisConfigured" . }}
- name: HEADSTART_TABLE_STORE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "headstart.redisUrlSecret" . }}
      key: url
{{- end }}
{{- end -}}

{{/* The Redis of the data sessions' live state (replicas publish data versions, the flash worker
     consumes them), from the same Secret as the block store's URL; nothing without Redis. */}}
{{- define "headstart.redisUrlEnv" -}}
{{- if include "headstart.redisConfigured" . }}
- name: HEADSTART_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "headstart.redisUrlSecret" . }}
      key: url
{{- end }}
{{- end -}}

{{/* Secret (name) holding the Redis password of the chart's own Redis. */}}
{{- define "headstart.redisPasswordSecret" -}}
{{- default (printf "%s-redis" (include "headstart.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{/* Secret (name) holding the engine secret that the gateway sends and the replicas check. */}}
{{- define "headstart.engineSecret" -}}
{{- default (printf "%s-engine-secret" (include "headstart.fullname" .)) .Values.engine.auth.existingSecret -}}
{{- end -}}

{{/* Direct session streams (values engine.direct): off while Serve autoscales (it counts only what its proxy carries). */}}
{{- define "headstart.engineDirect" -}}
{{- if and .Values.engine.direct.enabled (not .Values.engine.autoscaling.enabled) -}}true{{- end -}}
{{- end -}}

{{/* The replicas' direct ingress (services/engine/direct.py): every pod interface, the pod's IP advertised. */}}
{{- define "headstart.engineDirectEnv" -}}
{{- $d := .Values.engine.direct -}}
- name: HEADSTART_ENGINE_DIRECT
  value: {{ ternary "on" "off" (eq (include "headstart.engineDirect" .) "true") | quote }}
- name: HEADSTART_ENGINE_DIRECT_HOST
  value: "0.0.0.0"
- name: HEADSTART_ENGINE_DIRECT_PORTS
  value: {{ printf "%d-%d" (int $d.port) (add (int $d.port) (sub (int $d.portsPerPod) 1)) | quote }}
- name: HEADSTART_ENGINE_DIRECT_ADVERTISE
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end -}}

{{/* containerPort entries of the direct ingress. */}}
{{- define "headstart.engineDirectPorts" -}}
{{- if eq (include "headstart.engineDirect" .) "true" -}}
{{- range $i := until (int .Values.engine.direct.portsPerPod) }}
- name: direct-{{ $i }}
  containerPort: {{ add (int $.Values.engine.direct.port) $i }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "headstart.engineSecretEnv" -}}
- name: HEADSTART_ENGINE_SECRET_FILE
  value: /etc/headstart/engine/secret
{{- end -}}

{{/* The engine secret as a file (0440, group: the pod's fsGroup): a process's environment is readable by any code of its user. */}}
{{- define "headstart.engineSecretVolume" -}}
- name: engine-secret
  secret:
    secretName: {{ include "headstart.engineSecret" . }}
    defaultMode: 0440
    items:
      - key: secret
        path: secret
{{- end -}}

{{- define "headstart.engineSecretVolumeMount" -}}
- name: engine-secret
  mountPath: /etc/headstart/engine
  readOnly: true
{{- end -}}

{{/* The catalogue: the databases the engine and the gateway serve by name (values `catalogue`). */}}
{{- define "headstart.catalogueHasPostgres" -}}
{{- if or .Values.catalogue.postgres.existingSecret .Values.catalogue.postgres.dsns -}}true{{- end -}}
{{- end -}}

{{/* Secret (name) holding the catalogue's `alias=DSN` lines under the key `postgres`. */}}
{{- define "headstart.cataloguePostgresSecret" -}}
{{- default (printf "%s-catalogue-postgres" (include "headstart.fullname" .)) .Values.catalogue.postgres.existingSecret -}}
{{- end -}}

{{/* Ray pods' /dev/shm: memory-backed and larger than the container default of 64 MiB
     (Ray's object store falls back to slow disk-backed memory without it). */}}
{{- define "headstart.rayShmVolume" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.engine.shmSizeLimit }}
{{- end -}}

{{- define "headstart.rayShmVolumeMount" -}}
- name: dshm
  mountPath: /dev/shm
{{- end -}}

{{/* The catalogue's environment (shared/headstart/schema/catalogue.py); call with (dict "root" $ "gateway" true|false).
     Paths only: the DSNs stay in the Secret, read from the mounted file. The image's own Spider
     databases (/shared/data/spider) are served unless catalogue.spider.builtin is false or a
     claim replaces them. */}}
{{- define "headstart.catalogueEnv" -}}
{{- $c := .root.Values.catalogue }}
{{- if and (not $c.spider.builtin) (not $c.spider.claimName) }}
- name: HEADSTART_CATALOGUE_SPIDER
  value: "0"
{{- end }}
{{- if $c.spider.claimName }}
{{- $dir := clean (printf "/catalogue/spider/%s" (trimPrefix "/" $c.spider.path)) }}
- name: HEADSTART_SPIDER_DIR
  value: {{ $dir | quote }}
{{- if .gateway }}
- name: HEADSTART_GATEWAY_SPIDER_DIR
  value: {{ $dir | quote }}
{{- end }}
{{- end }}
{{- if $c.sqlite.claimName }}
{{- $roots := list }}
{{- range (default (list ".") $c.sqlite.roots) }}
{{- $roots = append $roots (clean (printf "/catalogue/sqlite/%s" (trimPrefix "/" .))) }}
{{- end }}
- name: HEADSTART_CATALOGUE_SQLITE_ROOTS
  value: {{ join ":" $roots | quote }}
{{- end }}
{{- if include "headstart.catalogueHasPostgres" .root }}
- name: HEADSTART_CATALOGUE_POSTGRES_FILE
  value: /etc/headstart/catalogue/postgres
{{- end }}
{{- end -}}

{{/* Volumes of the catalogue (all read-only); call with the root context. */}}
{{- define "headstart.catalogueVolumes" -}}
{{- $c := .Values.catalogue }}
{{- if $c.spider.claimName }}
- name: catalogue-spider
  persistentVolumeClaim:
    claimName: {{ $c.spider.claimName }}
    readOnly: true
{{- end }}
{{- if $c.sqlite.claimName }}
- name: catalogue-sqlite
  persistentVolumeClaim:
    claimName: {{ $c.sqlite.claimName }}
    readOnly: true
{{- end }}
{{- if include "headstart.catalogueHasPostgres" . }}
- name: catalogue-postgres
  secret:
    secretName: {{ include "headstart.cataloguePostgresSecret" . }}
    defaultMode: 0440
    items:
      - key: postgres
        path: postgres
{{- end }}
{{- end -}}

{{- define "headstart.catalogueVolumeMounts" -}}
{{- $c := .Values.catalogue }}
{{- if $c.spider.claimName }}
- name: catalogue-spider
  mountPath: /catalogue/spider
  readOnly: true
{{- end }}
{{- if $c.sqlite.claimName }}
- name: catalogue-sqlite
  mountPath: /catalogue/sqlite
  readOnly: true
{{- end }}
{{- if include "headstart.catalogueHasPostgres" . }}
- name: catalogue-postgres
  mountPath: /etc/headstart/catalogue
  readOnly: true
{{- end }}
{{- end -}}

{{/* A checksum of the catalogue values: pods restart (the catalogue is read at start) when it changes. */}}
{{- define "headstart.catalogueChecksum" -}}
{{- toJson .Values.catalogue | sha256sum -}}
{{- end -}}

{{/* The Gateway (Gateway API) the routes attach to: one parentRefs entry. */}}
{{- define "headstart.gatewayParentRef" -}}
{{- $p := .Values.gateway.gatewayApi.parentRef -}}
- name: {{ $p.name }}
  {{- with $p.namespace }}
  namespace: {{ . }}
  {{- end }}
  {{- with $p.sectionName }}
  sectionName: {{ . }}
  {{- end }}
{{- end -}}
