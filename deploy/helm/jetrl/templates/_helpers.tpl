{{- define "jetrl.fullname" -}}
{{- printf "%s-jetrl" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "jetrl.labels" -}}
app.kubernetes.io/name: jetrl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "jetrl.selector" -}}
app.kubernetes.io/name: jetrl
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "jetrl.secretName" -}}
{{- default (printf "%s-secrets" (include "jetrl.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* Every NATS seed: the pods of the NATS chart's StatefulSet through its headless service, or externalNats. */}}
{{- define "jetrl.natsServers" -}}
{{- if .Values.nats.enabled -}}
{{- $name := ternary .Release.Name (printf "%s-nats" .Release.Name) (contains "nats" .Release.Name) -}}
{{- with .Values.nats.fullnameOverride }}{{ $name = . }}{{ end -}}
{{- $n := int (ternary .Values.nats.config.cluster.replicas 1 .Values.nats.config.cluster.enabled) -}}
{{- $urls := list -}}
{{- range $i := until $n -}}
{{- $urls = append $urls (printf "nats://%s-%d.%s-headless:4222" $name $i $name) -}}
{{- end -}}
{{- toJson $urls -}}
{{- else -}}
{{- if not .Values.externalNats.servers -}}
{{- fail "externalNats.servers: list your NATS servers when nats.enabled is false" -}}
{{- end -}}
{{- .Values.externalNats.servers | toJson -}}
{{- end -}}
{{- end -}}

{{/* The JETRL__* environment of every jetrl container. */}}
{{- define "jetrl.env" -}}
- name: JETRL__NATS__SERVERS
  value: {{ include "jetrl.natsServers" . | quote }}
- name: JETRL__STREAMS__REPLICAS
  value: {{ .Values.streamReplicas | quote }}
- name: JETRL__WEIGHTS__URL
  value: {{ printf "http://%s-weights:%d" (include "jetrl.fullname" .) (int .Values.weights.port) | quote }}
- name: JETRL__WEIGHTS__ROOT
  value: /weights
- name: JETRL__WEIGHTS__SHARED_FS
  value: {{ .Values.weights.sharedFs | quote }}
- name: JETRL__CONTROLLER__URL
  value: {{ printf "http://%s-controller:%d" (include "jetrl.fullname" .) (int .Values.controller.port) | quote }}
- name: JETRL__TELEMETRY__METRICS_HOST
  value: 0.0.0.0
- name: JETRL__TELEMETRY__METRICS_PORT
  value: {{ .Values.metricsPort | quote }}
- name: JETRL__TELEMETRY__LOG_FORMAT
  value: json
{{- range $var, $key := dict "JETRL__CONTROLLER__TOKEN" "controller-token" "JETRL__WEIGHTS__TOKEN" "weights-token" "JETRL__WEIGHTS__READ_TOKEN" "weights-read-token" }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ include "jetrl.secretName" $ }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end -}}

{{/* How a service authenticates to NATS: (dict "root" $ "role" ROLE). With nats.perServiceUsers, as its
own user `jetrl-<role>` (a role of nats.jetrlPermissions = shared/runtime/nats_permissions.py) with the password
from the Secret's nats-password-<role>, creating the streams only as the controller; role "" (the weight
store, which does not use NATS) gets nothing. Otherwise the Secret's nats-token, as before. */}}
{{- define "jetrl.natsAuthEnv" -}}
{{- $v := .root.Values -}}
{{- if $v.nats.perServiceUsers -}}
{{- if .role -}}
{{- if not (hasKey (default dict $v.nats.jetrlPermissions) .role) -}}
{{- fail (printf "nats.jetrlPermissions: no role %q (regenerate it with `jetrl nats-config --helm`)" .role) -}}
{{- end }}
- name: JETRL__NATS__USER
  value: {{ printf "jetrl-%s" .role | quote }}
- name: JETRL__NATS__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "jetrl.secretName" .root }}
      key: {{ printf "nats-password-%s" .role }}
- name: JETRL__STREAMS__MANAGE
  value: {{ eq .role "controller" | quote }}
{{- end -}}
{{- else }}
- name: JETRL__NATS__TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "jetrl.secretName" .root }}
      key: nats-token
      optional: true
{{- end -}}
{{- end -}}

{{/* The bundled NATS server reads the passwords from nats.jetrlSecret (the NATS chart cannot see
secrets.*): with secrets.existingSecret both must name the same Secret. */}}
{{- define "jetrl.checkNatsSecret" -}}
{{- $v := .Values -}}
{{- if and $v.nats.enabled $v.nats.perServiceUsers -}}
{{- if ne (default "" $v.nats.jetrlSecret) (default "" $v.secrets.existingSecret) -}}
{{- fail (printf "nats.jetrlSecret: set it to secrets.existingSecret (%q): the bundled NATS server reads the services' passwords (nats-password-<role>) from that Secret" $v.secrets.existingSecret) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "jetrl.image" -}}
image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end -}}

{{- define "jetrl.podSpecCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  fsGroup: 1000
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* resources with the GPU count added to limits (and requests) when gpus > 0 */}}
{{- define "jetrl.resources" -}}
{{- $r := deepCopy (default dict .resources) -}}
{{- if gt (int .gpus) 0 -}}
{{- $limits := default dict $r.limits -}}
{{- $_ := set $limits .gpuResource (int .gpus) -}}
{{- $_ := set $r "limits" $limits -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}

{{- define "jetrl.metricsProbes" -}}
livenessProbe:
  httpGet: {path: /metrics, port: metrics}
  initialDelaySeconds: 30
  periodSeconds: 20
  failureThreshold: 6
readinessProbe:
  httpGet: {path: /metrics, port: metrics}
  periodSeconds: 10
{{- end -}}
