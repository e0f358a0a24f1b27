{{/* Names and labels. */}}
{{- define "plover.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "plover.fullname" -}}
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

{{- define "plover.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "plover.selectorLabels" -}}
app.kubernetes.io/name: {{ include "plover.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "plover.labels" -}}
helm.sh/chart: {{ include "plover.chart" . }}
{{ include "plover.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The metrics port's own Service (ClusterIP whatever service.type is). */}}
{{- define "plover.metricsServiceName" -}}
{{- printf "%s-metrics" (include "plover.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "plover.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "plover.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "plover.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Secrets: an existing one named in values, else the chart's own. */}}
{{- define "plover.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "plover.fullname" .)) }}
{{- end }}

{{- define "plover.s3SecretName" -}}
{{- .Values.s3.existingSecret | default (printf "%s-s3" (include "plover.fullname" .)) }}
{{- end }}

{{/* The --store URL: store.url, else s3://BUCKET[/PREFIX]. */}}
{{- define "plover.storeURL" -}}
{{- if .Values.store.url }}
{{- .Values.store.url }}
{{- else if .Values.s3.bucket }}
{{- $prefix := trimAll "/" (.Values.s3.prefix | toString) }}
{{- if $prefix }}
{{- printf "s3://%s/%s" .Values.s3.bucket $prefix }}
{{- else }}
{{- printf "s3://%s" .Values.s3.bucket }}
{{- end }}
{{- end }}
{{- end }}

{{- define "plover.usesS3" -}}
{{- if hasPrefix "s3://" (include "plover.storeURL" .) }}true{{ end }}
{{- end }}

{{- define "plover.scheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{- define "plover.terminationGracePeriodSeconds" -}}
{{- $min := add (int .Values.preStopSleepSeconds) (int .Values.server.graceSeconds) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $min 5 }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* plover serve's --timeout where none is given (cli/serve.go's
     defaultTimeout; the chart test holds the two together). */}}
{{- define "plover.defaultTimeout" -}}30s{{- end }}

{{/* The request deadline given explicitly, as "SOURCE\tVALUE" ("" if none):
     --timeout in server.extraArgs (--timeout=D, or --timeout then D; the
     last wins, as on plover's command line), else a literal PLOVER_TIMEOUT in
     env (a flag on the command line wins over the variable). */}}
{{- define "plover.explicitTimeout" -}}
{{- $args := .Values.server.extraArgs | default list }}
{{- $found := "" }}
{{- range $i, $a := $args }}
{{- $a = toString $a }}
{{- if hasPrefix "--" $a }}{{ $a = trimPrefix "-" $a }}{{ end }}{{/* Go's flags take -timeout as --timeout */}}
{{- if hasPrefix "-timeout=" $a }}
{{- $found = printf "server.extraArgs --timeout\t%s" (trimPrefix "-timeout=" $a) }}
{{- else if and (eq $a "-timeout") (lt (add1 $i) (len $args)) }}
{{- $found = printf "server.extraArgs --timeout\t%s" (toString (index $args (add1 $i))) }}
{{- end }}
{{- end }}
{{- if not $found }}
{{- range (.Values.env | default list) }}
{{- if and (eq (toString .name) "PLOVER_TIMEOUT") (hasKey . "value") }}
{{- $found = printf "env PLOVER_TIMEOUT\t%s" (toString .value) }}
{{- else if and (eq (toString .name) "PLOVER_TIMEOUT") (hasKey . "valueFrom") }}
{{- $found = "unknown" }}{{/* read at run time (a ConfigMap's, a Secret's): not checkable here */}}
{{- end }}
{{- end }}
{{- end }}
{{- $found }}
{{- end }}

{{/* A Go duration (what plover's duration flags take, time.ParseDuration:
     "30s", "1m30s", ".5s", "+30s", "1.5h", "0") in whole seconds, rounded up;
     fails on anything else, a negative one included. Takes
     (list WHAT DURATION). */}}
{{- define "plover.durationSeconds" -}}
{{- $what := index . 0 }}
{{- $d := index . 1 }}
{{- if eq $d "0" }}0
{{- else }}
{{- if not (regexMatch "^\\+?(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$" $d) }}
{{- fail (printf "%s %q: want a Go duration such as 30s, 2m or 1m30s" $what $d) }}
{{- end }}
{{- $unit := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ns" 0.000000001 }}
{{- $sum := 0.0 }}
{{- range regexFindAll "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" $d -1 }}
{{- $n := regexReplaceAll "(ns|us|µs|μs|ms|s|m|h)$" . "" }}
{{- $u := trimPrefix $n . }}
{{- $sum = addf $sum (mulf (float64 $n) (get $unit $u)) }}
{{- end }}
{{- int (ceil $sum) }}
{{- end }}
{{- end }}

{{/* Why the release may run more than one pod ("" for at most one): a
     DaemonSet, the chart's autoscaler, replicaCount null (an external
     autoscaler's) or above 1. */}}
{{- define "plover.manyPods" -}}
{{- if ne .Values.kind "Deployment" }}kind {{ .Values.kind }} (a pod per node)
{{- else if .Values.autoscaling.enabled }}autoscaling.enabled
{{- else if kindIs "invalid" .Values.replicaCount }}replicaCount null (an external autoscaler's)
{{- else if gt (int .Values.replicaCount) 1 }}replicaCount {{ int .Values.replicaCount }}
{{- end }}
{{- end }}

{{/* A Kubernetes quantity with a binary suffix (Ki, Mi, Gi, Ti), in MiB,
     rounded up; "" for any other form (plain bytes, M, G, ...), which the
     checks below then leave alone. */}}
{{- define "plover.mebibytes" -}}
{{- $q := toString . }}
{{- if regexMatch "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti)$" $q }}
{{- $n := float64 (regexReplaceAll "(Ki|Mi|Gi|Ti)$" $q "") }}
{{- $f := get (dict "Ki" 0.0009765625 "Mi" 1.0 "Gi" 1024.0 "Ti" 1048576.0) (regexFind "(Ki|Mi|Gi|Ti)$" $q) }}
{{- int (ceil (mulf $n $f)) }}
{{- end }}
{{- end }}

{{/* Refuse settings that would deploy something broken or unsafe. */}}
{{- define "plover.validate" -}}
{{- if not (has .Values.kind (list "Deployment" "DaemonSet")) }}
{{- fail (printf "kind %q: want Deployment or DaemonSet" .Values.kind) }}
{{- end }}
{{- if not (include "plover.storeURL" .) }}
{{- fail "set s3.bucket (the store every pod serves from; s3.prefix, s3.endpoint and s3.region as needed) or store.url" }}
{{- end }}
{{- /* A file:// store is on each pod's own data volume (the chart mounts no
       shared one): with several pods a deploy reaches one of them. With a
       repository every pod deploys the same folders into its own store. */}}
{{- if and (hasPrefix "file://" (include "plover.storeURL" .)) (not .Values.repository.enabled) (include "plover.manyPods" .) }}
{{- fail (printf "store.url %s is a store on each pod's own data volume, and with %s there are several pods: a deploy would reach one of them, which alone would serve it. Use replicaCount=1 (a trial), a shared store (s3.bucket), or a model repository (repository.enabled: every pod deploys the same folders into its own store)" (include "plover.storeURL" .) (include "plover.manyPods" .)) }}
{{- end }}
{{- if and (include "plover.usesS3" .) (not .Values.s3.existingSecret) (not .Values.s3.createSecret) }}
{{- fail "an s3:// store needs credentials: s3.existingSecret (a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or s3.createSecret=true with s3.accessKeyId and s3.secretAccessKey" }}
{{- end }}
{{- if and .Values.s3.createSecret (not .Values.s3.existingSecret) (or (not .Values.s3.accessKeyId) (not .Values.s3.secretAccessKey)) }}
{{- fail "s3.createSecret=true needs s3.accessKeyId and s3.secretAccessKey" }}
{{- end }}
{{- if and (not .Values.auth.existingSecret) (not .Values.auth.tokens) (not .Values.auth.insecureNoAuth) }}
{{- fail "plover listens beyond loopback and needs an auth file: set auth.existingSecret (a Secret with key \"tokens\", lines from `plover token new`) or auth.tokens; auth.insecureNoAuth=true only on a trusted network" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "serviceMonitor.enabled needs metrics.enabled (the unauthenticated --metrics-listen port it scrapes)" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (ne .Values.kind "Deployment") }}
{{- fail "autoscaling.enabled needs kind Deployment (a DaemonSet runs one pod per node)" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (not (has .Values.autoscaling.metricType (list "Pods" "External"))) }}
{{- fail (printf "autoscaling.metricType %q: want Pods or External" .Values.autoscaling.metricType) }}
{{- end }}
{{- if lt (int (include "plover.terminationGracePeriodSeconds" .)) (add (int .Values.preStopSleepSeconds) (int .Values.server.graceSeconds)) }}
{{- fail (printf "terminationGracePeriodSeconds %v is less than preStopSleepSeconds + server.graceSeconds (%d): pods would be killed mid-drain" .Values.terminationGracePeriodSeconds (add (int .Values.preStopSleepSeconds) (int .Values.server.graceSeconds))) }}
{{- end }}
{{- /* Flags the chart derives other objects or checks from: given again in
       extraArgs, the last would win on plover's command line and leave the
       probes, the Service, the Ingress or the ServiceMonitor on the chart's
       ports (--listen, --metrics-listen, --grpc-listen), the probes on HTTP
       against an HTTPS server (--tls-cert, --tls-key: never ready, restarted),
       the pods' termination grace below the drain (--grace), the bundle cache
       past the memory check for a tmpfs data volume (--cache-limit), or the
       Ingress's proxy-body-size below the server's limit (--max-body). */}}
{{- $tls := "tls.enabled and tls.secretName instead: the chart passes --tls-cert and --tls-key from them and switches the probes to HTTPS, so TLS of its own would have the probes speak HTTP to an HTTPS server and the pod never become ready" }}
{{- $owned := dict
      "grace" "server.graceSeconds instead: the chart passes --grace from it, and the pods' terminationGracePeriodSeconds and the --timeout check are computed from it, so a --grace of its own would be killed mid-drain"
      "listen" "server.port instead: the chart passes --listen from it, and the probes, the Service and the Ingress reach the API on that port, so a --listen of its own would move the API away from them"
      "metrics-listen" "metrics.enabled and metrics.port instead: the chart passes --metrics-listen from them, and the Service's metrics port and the ServiceMonitor scrape that port, so a --metrics-listen of its own would move the metrics away from them"
      "grpc-listen" "grpc.enabled and grpc.port instead: the chart passes --grpc-listen from them, and the Service's grpc port leads there, so a --grpc-listen of its own would move gRPC away from it"
      "tls-cert" $tls
      "tls-key" $tls
      "cache-limit" "server.cacheLimitMiB instead: the chart passes --cache-limit from it and checks it against resources.limits.memory when data.medium is Memory, so a --cache-limit of its own would pass unchecked"
      "max-body" "server.maxBodyMiB instead: the chart passes --max-body from it and sets the Ingress's proxy-body-size from it, so a --max-body of its own would have the Ingress refuse bodies the server takes" }}
{{- range (.Values.server.extraArgs | default list) }}
{{- $arg := toString . }}
{{- $a := $arg }}
{{- if hasPrefix "--" $a }}{{ $a = trimPrefix "-" $a }}{{ end }}{{/* Go's flags take -name as --name */}}
{{- range $flag := keys $owned | sortAlpha }}
{{- if or (eq $a (printf "-%s" $flag)) (hasPrefix (printf "-%s=" $flag) $a) }}
{{- fail (printf "server.extraArgs %s: set %s" $arg (get $owned $flag)) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* plover serve reads each flag from PLOVER_<FLAG> too, where the command
       line does not give it: an env entry for a flag the chart passes only
       sometimes (--tls-cert without tls.enabled) would do what the list
       above refuses, and one for a flag it always passes would be ignored. */}}
{{- range (.Values.env | default list) }}
{{- $name := toString .name }}
{{- range $flag := keys $owned | sortAlpha }}
{{- if eq $name (printf "PLOVER_%s" (upper (replace "-" "_" $flag))) }}
{{- fail (printf "env %s: set %s" $name (get $owned $flag)) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* Without a --timeout of the user's, plover's own default is the deadline
       the grace must cover: a graceSeconds lowered below it cut requests as
       an explicit --timeout past it would. A --timeout of 0 plover refuses
       at start, which says so. */}}
{{- $timeout := include "plover.explicitTimeout" . | default (printf "plover serve's default --timeout\t%s" (include "plover.defaultTimeout" .)) }}
{{- if ne $timeout "unknown" }}
{{- $src := index (splitList "\t" $timeout) 0 }}
{{- $val := index (splitList "\t" $timeout) 1 }}
{{- $secs := int (include "plover.durationSeconds" (list $src $val)) }}
{{- if gt $secs (int $.Values.server.graceSeconds) }}
{{- fail (printf "%s %s is longer than server.graceSeconds (%d): a rollout would cut requests still within their deadline; set server.graceSeconds to %d or more" $src $val (int $.Values.server.graceSeconds) $secs) }}
{{- end }}
{{- end }}
{{- /* A tmpfs data volume counts toward the pod's memory: neither it nor the
       bundle cache on it may exceed the memory limit. */}}
{{- if and (eq .Values.data.type "emptyDir") (eq (toString .Values.data.medium) "Memory") }}
{{- $lim := ((.Values.resources | default dict).limits | default dict).memory }}
{{- with and $lim (include "plover.mebibytes" $lim) }}
{{- $limMiB := int . }}
{{- with include "plover.mebibytes" $.Values.data.sizeLimit }}
{{- if gt (int .) $limMiB }}
{{- fail (printf "data.medium Memory: data.sizeLimit %s is more than resources.limits.memory %s, and a tmpfs counts toward the pod's memory: the pod would be killed for memory before the volume filled. Lower data.sizeLimit or raise the limit" (toString $.Values.data.sizeLimit) (toString $lim)) }}
{{- end }}
{{- end }}
{{- if gt (int $.Values.server.cacheLimitMiB) $limMiB }}
{{- fail (printf "data.medium Memory: server.cacheLimitMiB %d is more than resources.limits.memory %s (%d MiB), and the bundle cache on a tmpfs counts toward the pod's memory. Lower server.cacheLimitMiB or raise the limit" (int $.Values.server.cacheLimitMiB) (toString $lim) $limMiB) }}
{{- end }}
{{- end }}
{{- end }}
{{- if not (has (toString .Values.server.workerScope) (list "function" "tenant")) }}
{{- fail (printf "server.workerScope %q: want function or tenant" (toString .Values.server.workerScope)) }}
{{- end }}
{{- if not (has .Values.data.type (list "emptyDir" "ephemeral")) }}
{{- fail (printf "data.type %q: want emptyDir or ephemeral" .Values.data.type) }}
{{- end }}
{{- if and .Values.image.tag (not (kindIs "string" .Values.image.tag)) }}
{{- fail "image.tag: a number, not a string, as YAML and --set read it (1.10 reads as 1.1, 20260101 as 2.0260101e+07): quote it in values, or use --set-string" }}
{{- end }}
{{- if and .Values.metrics.enabled (eq (int .Values.metrics.port) (int .Values.server.port)) }}
{{- fail (printf "metrics.port %v is server.port too: the metrics listener needs a port of its own" .Values.metrics.port) }}
{{- end }}
{{- if .Values.grpc.enabled }}
{{- $p := int .Values.grpc.port }}
{{- if or (lt $p 1) (gt $p 65535) (ne (toString $p) (toString .Values.grpc.port)) }}
{{- fail (printf "grpc.port %v: want a port number, 1 to 65535" .Values.grpc.port) }}
{{- end }}
{{- if eq $p (int .Values.server.port) }}
{{- fail (printf "grpc.port %d is server.port too: the gRPC listener needs a port of its own" $p) }}
{{- end }}
{{- if and .Values.metrics.enabled (eq $p (int .Values.metrics.port)) }}
{{- fail (printf "grpc.port %d is metrics.port too: the gRPC listener needs a port of its own" $p) }}
{{- end }}
{{- end }}
{{- include "plover.validateRepository" . }}
{{- with .Values.tracing.otlpEndpoint }}
{{- if not (regexMatch "^https?://[^/]" .) }}
{{- fail (printf "tracing.otlpEndpoint %q: want the collector's URL with its scheme, e.g. http://otel-collector.observability:4318" .) }}
{{- end }}
{{- if not (has $.Values.tracing.protocol (list "http/protobuf" "grpc")) }}
{{- fail (printf "tracing.protocol %q: want http/protobuf or grpc" $.Values.tracing.protocol) }}
{{- end }}
{{- $sampler := $.Values.tracing.sampler | default "" }}
{{- if and $sampler (not (has $sampler (list "always_on" "always_off" "traceidratio" "parentbased_always_on" "parentbased_always_off" "parentbased_traceidratio"))) }}
{{- fail (printf "tracing.sampler %q: want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio" $sampler) }}
{{- end }}
{{- if and (hasSuffix "traceidratio" $sampler) (not (regexMatch "^(0(\\.[0-9]+)?|1(\\.0+)?|0?\\.[0-9]+)$" (toString $.Values.tracing.samplerArg))) }}
{{- fail (printf "tracing.samplerArg %q: want a ratio from 0 to 1 as a decimal, e.g. \"0.1\"" (toString $.Values.tracing.samplerArg)) }}
{{- end }}
{{- if and $.Values.tracing.headersSecret.name (not $.Values.tracing.headersSecret.key) }}
{{- fail "tracing.headersSecret.name needs tracing.headersSecret.key (the Secret's key holding OTEL_EXPORTER_OTLP_HEADERS)" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The model repository (repository.*): one source, a usable path and period. */}}
{{- define "plover.validateRepository" -}}
{{- $r := .Values.repository }}
{{- if $r.enabled }}
{{- $sources := list }}
{{- if $r.existingClaim }}{{ $sources = append $sources "existingClaim" }}{{ end }}
{{- if $r.volume }}{{ $sources = append $sources "volume" }}{{ end }}
{{- if $r.sync.enabled }}{{ $sources = append $sources "sync.enabled" }}{{ end }}
{{- if not $sources }}
{{- fail "repository.enabled needs a source: repository.existingClaim (a PersistentVolumeClaim, mounted read-only), repository.volume (any volume source, as-is) or repository.sync.enabled (an emptyDir that repository.sync.image fills, e.g. from S3)" }}
{{- end }}
{{- if gt (len $sources) 1 }}
{{- fail (printf "repository: set one source, not %s (repository.existingClaim, repository.volume or repository.sync.enabled)" (join " and " $sources)) }}
{{- end }}
{{- $path := toString $r.mountPath }}
{{- if not (regexMatch "^/[^:]*[^/:]$" $path) }}
{{- fail (printf "repository.mountPath %q: want an absolute path without a trailing slash, e.g. /models" $path) }}
{{- end }}
{{- range list "/tmp" "/var/lib/plover" "/etc/plover" }}
{{- if or (eq $path .) (hasPrefix (printf "%s/" .) $path) (hasPrefix (printf "%s/" $path) .) }}
{{- fail (printf "repository.mountPath %q overlaps %s, which the chart mounts: choose another, e.g. /models" $path .) }}
{{- end }}
{{- end }}
{{- with $r.pollPeriod }}
{{- if not (regexMatch "^([0-9]+(\\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$" (toString .)) }}
{{- fail (printf "repository.pollPeriod %q: want a Go duration such as 30s or 5m (a string)" (toString .)) }}
{{- end }}
{{- end }}
{{- if $r.sync.enabled }}
{{- if not $r.sync.image }}
{{- fail "repository.sync.enabled needs repository.sync.image (and usually command/args): the chart ships no sync image" }}
{{- end }}
{{- if not (has $r.sync.mode (list "init" "sidecar")) }}
{{- fail (printf "repository.sync.mode %q: want init (copy once before plover starts) or sidecar (keep copying beside it)" $r.sync.mode) }}
{{- end }}
{{- if and (eq $r.sync.mode "sidecar") (not (semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version)) }}
{{- fail (printf "repository.sync.mode sidecar needs Kubernetes >= 1.29 (native sidecar containers); this cluster is %s: use mode init" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if and $r.sync.startupProbe (ne $r.sync.mode "sidecar") }}
{{- fail "repository.sync.startupProbe applies to mode sidecar only (an init container runs to completion before plover starts)" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* OTEL_RESOURCE_ATTRIBUTES: the pod's Kubernetes attributes (K8S_* are set
     before it in the container's env, so the kubelet expands them), unless
     tracing.resourceAttributes gives the key, then tracing.resourceAttributes;
     each group's keys sorted. */}}
{{- define "plover.otelResourceAttributes" -}}
{{- $extra := .Values.tracing.resourceAttributes | default dict }}
{{- $a := list }}
{{- range $k, $v := dict "k8s.namespace.name" .Release.Namespace "k8s.pod.name" "$(K8S_POD_NAME)" "k8s.node.name" "$(K8S_NODE_NAME)" }}
{{- if not (hasKey $extra $k) }}
{{- $a = append $a (printf "%s=%s" $k $v) }}
{{- end }}
{{- end }}
{{- range $k := keys $extra | sortAlpha }}
{{- $a = append $a (printf "%s=%v" $k (get $extra $k)) }}
{{- end }}
{{- join "," $a }}
{{- end }}

{{/* plover serve's flags (the image's entrypoint is tini -- plover serve). */}}
{{- define "plover.args" -}}
{{- $a := list (printf "--listen=0.0.0.0:%d" (int .Values.server.port)) "--data=/var/lib/plover" }}
{{- if .Values.device }}
{{- $a = append $a (printf "--device=%s" .Values.device) }}
{{- else if .Values.gpu.enabled }}
{{- $a = append $a "--device=cuda" }}
{{- else }}
{{- $a = append $a "--device=host" }}
{{- end }}
{{- $a = append $a (printf "--store=%s" (include "plover.storeURL" .)) }}
{{- if .Values.s3.endpoint }}
{{- $a = append $a (printf "--s3-endpoint=%s" .Values.s3.endpoint) }}
{{- end }}
{{- if .Values.s3.region }}
{{- $a = append $a (printf "--s3-region=%s" .Values.s3.region) }}
{{- end }}
{{- if .Values.s3.insecure }}
{{- $a = append $a "--s3-insecure" }}
{{- end }}
{{- if or .Values.auth.existingSecret .Values.auth.tokens }}
{{- $a = append $a (printf "--auth-file=/etc/plover/auth/%s" .Values.auth.key) }}
{{- else }}
{{- $a = append $a "--insecure-no-auth" }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- $a = concat $a (list "--tls-cert=/etc/plover/tls/tls.crt" "--tls-key=/etc/plover/tls/tls.key") }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- $a = append $a (printf "--metrics-listen=0.0.0.0:%d" (int .Values.metrics.port)) }}
{{- end }}
{{- if .Values.grpc.enabled }}
{{- $a = append $a (printf "--grpc-listen=0.0.0.0:%d" (int .Values.grpc.port)) }}
{{- end }}
{{- if .Values.repository.enabled }}
{{- $a = append $a (printf "--repository=%s" .Values.repository.mountPath) }}
{{- with .Values.repository.pollPeriod }}
{{- $a = append $a (printf "--repository-poll=%s" (toString .)) }}
{{- end }}
{{- end }}
{{- $a = append $a (printf "--grace=%ds" (int .Values.server.graceSeconds)) }}
{{- $a = append $a (printf "--cache-limit=%d" (int .Values.server.cacheLimitMiB)) }}
{{- $a = append $a (printf "--max-body=%d" (int .Values.server.maxBodyMiB)) }}
{{- $a = append $a (printf "--log-format=%s" .Values.server.logFormat) }}
{{- $a = append $a (printf "--log-level=%s" .Values.server.logLevel) }}
{{- if ne (toString .Values.server.workerScope) "function" }}{{/* the default: an older image need not know the flag */}}
{{- $a = append $a (printf "--worker-scope=%s" .Values.server.workerScope) }}
{{- end }}
{{- range (.Values.server.extraArgs | default list) }}
{{- $a = append $a (toString .) }}
{{- end }}
{{- toYaml $a }}
{{- end }}
