{{/* Names, labels, the image, and the appliance's command line. */}}

{{- define "appliance.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "appliance.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "appliance.labels" -}}
{{ include "appliance.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* image.tag, else the appVersion (+ "-cuda" with GPUs): the tags docs/deploy.md builds. */}}
{{- define "appliance.image" -}}
{{- $tag := .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-cuda" "" (gt (int .Values.gpu.count) 0))) -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{/* The ConfigMap key of an extraConfig path (keys cannot hold "/"): pipeline/x.yaml -> pipeline.x.yaml. */}}
{{- define "appliance.configKey" -}}
{{- replace "/" "." . -}}
{{- end -}}

{{/* "pool" or "generate": the engine kind of .Values.pipeline. An extraConfig pipeline's is read from its
     `override /engine: NAME` default (and an extraConfig engine file's `kind`); a shipped pipeline's from
     this table of the conf/pipeline/ files that use a pooling engine (a test keeps it in step). */}}
{{- define "appliance.engineKind" -}}
{{- $file := get .Values.extraConfig (printf "pipeline/%s.yaml" .Values.pipeline) -}}
{{- $engine := "" -}}
{{- if $file -}}
{{- range $entry := (fromYaml $file).defaults | default list -}}
{{- if kindIs "map" $entry -}}
{{- range $key, $choice := $entry -}}
{{- if eq (regexReplaceAll "^(override\\s+)?/?" $key "") "engine" -}}{{- $engine = $choice -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- else if has .Values.pipeline (list "prithvi_flood" "prithvi_burn_scars" "prithvi_crops" "llava_encode") -}}
{{- $engine = "pool" -}}
{{- end -}}
{{- $engineFile := get .Values.extraConfig (printf "engine/%s.yaml" $engine) -}}
{{- if $engineFile -}}
{{- (fromYaml $engineFile).kind | default "generate" -}}
{{- else -}}
{{- ternary "pool" "generate" (eq $engine "pool") -}}
{{- end -}}
{{- end -}}

{{/* The overrides the chart puts before the user's, as a JSON list: the CUDA engine when gpu.count > 0
     (the `cuda` engine group for a generating pipeline unless the overrides pick an engine group
     themselves; only the device for a pooling one, whose engine group is `pool`). */}}
{{- define "appliance.gpuOverrides" -}}
{{- $out := list -}}
{{- if gt (int .Values.gpu.count) 0 -}}
{{- $picksEngine := false -}}
{{- range .Values.overrides -}}{{- if hasPrefix "engine=" . -}}{{- $picksEngine = true -}}{{- end -}}{{- end -}}
{{- if or $picksEngine (eq (include "appliance.engineKind" .) "pool") -}}
{{- $out = append $out "engine.device=cuda" -}}
{{- else -}}
{{- $out = append $out "engine=cuda" -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Values that cannot work together, refused at `helm template` with what to change. */}}
{{- define "appliance.validate" -}}
{{- $v := .Values -}}
{{- if and $v.model.existingClaim $v.model.hostPath -}}
{{- fail "model: give existingClaim or hostPath, not both" -}}
{{- end -}}
{{- $gpus := int $v.gpu.count -}}
{{- range $v.overrides -}}
{{- if hasPrefix "engine.tensor_parallel_size=" . -}}
{{- $tp := trimPrefix "engine.tensor_parallel_size=" . | int -}}
{{- if and (gt $gpus 0) (gt $tp $gpus) -}}
{{- fail (printf "overrides: %s needs gpu.count >= %d (got %d)" . $tp $gpus) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $v.mode "batch" -}}
{{- if and $v.batch.inputs $v.batch.search -}}
{{- fail "batch.search: give batch.inputs (a list of scenes) or batch.search (a STAC API search), not both" -}}
{{- end -}}
{{- if and $v.batch.search (not $v.batch.search.url) -}}
{{- fail "batch.search.url: a search needs the STAC API's URL" -}}
{{- end -}}
{{- if not (or $v.batch.inputs $v.batch.search) -}}
{{- fail "batch.inputs: mode=batch needs at least one GeoTIFF path, or batch.search (a STAC API search)" -}}
{{- end -}}
{{- if not $v.batch.volume -}}{{- fail "batch.volume: mode=batch needs the PersistentVolumeClaim holding the inputs" -}}{{- end -}}
{{- if not $v.batch.output -}}{{- fail "batch.output: mode=batch needs an output directory inside batch.volume" -}}{{- end -}}
{{- if regexMatch "(?i)\\.tiff?$" $v.batch.output -}}
{{- fail (printf "batch.output: %s looks like a file; give a directory (each scene's mask is written into it)" $v.batch.output) -}}
{{- end -}}
{{- range $key := list "autoscaling" "podDisruptionBudget" -}}
{{- if (get $v $key).enabled -}}{{- fail (printf "%s.enabled: only for mode=serve (a batch Job has no Deployment)" $key) -}}{{- end -}}
{{- end -}}
{{- if $v.metrics.serviceMonitor.enabled -}}
{{- fail "metrics.serviceMonitor.enabled: only for mode=serve (a batch Job has no server to scrape)" -}}
{{- end -}}
{{- if $v.ingress.enabled -}}
{{- fail "ingress.enabled: only for mode=serve (a batch Job has no Service to route to)" -}}
{{- end -}}
{{- end -}}
{{- if and $v.ingress.enabled (ne $v.ingress.path "/") (ne $v.ingress.className "nginx") -}}
{{- fail (printf "ingress.path=%s: a path prefix needs className: nginx (the chart strips it with ingress-nginx's rewrite-target); for another controller keep path / and give the server a host of its own" $v.ingress.path) -}}
{{- end -}}
{{- range $v.overrides -}}
{{- if hasPrefix "server.metrics_names=" . -}}
{{- fail (printf "overrides: %s; set metrics.names instead (the autoscaler's metric and the dashboard follow it)" .) -}}
{{- end -}}
{{- if hasPrefix "server.cors_origins=" . -}}
{{- fail (printf "overrides: %s; set server.corsOrigins instead (values.schema.json checks each origin)" .) -}}
{{- end -}}
{{- if hasPrefix "server.allowed_s3_buckets=" . -}}
{{- fail (printf "overrides: %s; set server.s3.allowedBuckets instead (server.s3.credentialsSecret reaches the server with it)" .) -}}
{{- end -}}
{{- end -}}
{{- if and $v.server.s3.credentialsSecret (not $v.server.s3.allowedBuckets) -}}
{{- fail "server.s3.credentialsSecret: set server.s3.allowedBuckets too (without buckets the server reads no s3:// input, so it gets no credentials)" -}}
{{- end -}}
{{- if $v.autoscaling.enabled -}}
{{- if gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas) -}}
{{- fail (printf "autoscaling: minReplicas %d is above maxReplicas %d" (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- if and (eq $v.autoscaling.metric "cpu") (not (and $v.resources.requests $v.resources.requests.cpu)) -}}
{{- fail "autoscaling.metric=cpu: set resources.requests.cpu (utilisation is measured against it)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* What `serve` takes after `pipeline=P`, as a JSON list: what the chart derives, the overrides. */}}
{{- define "appliance.serveSettings" -}}
{{- $args := list "server.host=0.0.0.0"
      (printf "server.port=%d" (int .Values.server.port))
      (printf "server.drain_timeout_s=%d" (int .Values.server.drainTimeoutSeconds)) -}}
{{- if ne .Values.metrics.names "appliance" -}}
{{- $args = append $args (printf "server.metrics_names=%s" .Values.metrics.names) -}}
{{- end -}}
{{- with .Values.server.s3.allowedBuckets -}}
{{- $quoted := list -}}
{{- range . -}}{{- $quoted = append $quoted (printf "'%s'" .) -}}{{- end -}}
{{- $args = append $args (printf "server.allowed_s3_buckets=[%s]" (join "," $quoted)) -}}
{{- end -}}
{{- with .Values.server.corsOrigins -}}
{{- $quoted := list -}}
{{- range . -}}{{- $quoted = append $quoted (printf "'%s'" .) -}}{{- end -}}
{{- $args = append $args (printf "server.cors_origins=[%s]" (join "," $quoted)) -}}
{{- end -}}
{{- $args = concat $args (include "appliance.gpuOverrides" . | fromJsonArray) .Values.overrides -}}
{{- toJson $args -}}
{{- end -}}

{{/* `serve`'s arguments, as a JSON list: the verb, the pipeline, what the chart derives, the overrides. */}}
{{- define "appliance.serveArgs" -}}
{{- concat (list "serve" (printf "pipeline=%s" .Values.pipeline)) (include "appliance.serveSettings" . | fromJsonArray) | toJson -}}
{{- end -}}

{{/* `input=[[...],[...]]` for a list of scenes, each a path inside batch.volume (mounted at /data) or a URL,
     or a list of them (a multi-date model's dates; per-band files), every file double-quoted so that Hydra
     keeps spaces and commas. Every scene is a list, a lone file a list of one: `appliance run` reads
     `[[a.tif],[b.tif]]` as two scenes for any model (for a multi-date model `[a.tif,b.tif]` would be one
     scene of two dates), so the chart needs not know how many dates the model takes. Takes the list. */}}
{{- define "appliance.inputArg" -}}
{{- $scenes := list -}}
{{- range . -}}
{{- $quoted := list -}}
{{- range (ternary (list .) . (kindIs "string" .)) -}}
{{- $quoted = append $quoted (ternary (printf "\"%s\"" .) (printf "\"/data/%s\"" .) (contains "://" .)) -}}
{{- end -}}
{{- $scenes = append $scenes (printf "[%s]" (join "," $quoted)) -}}
{{- end -}}
{{- printf "input=[%s]" (join "," $scenes) -}}
{{- end -}}

{{/* What `run` takes after `pipeline=P` and its inputs, as a JSON list: the output directory,
     overwrite=true for a list of inputs (a retried index rewrites its masks; the overrides, last, may
     turn it off; a search's retried index resumes instead, skipping its complete scenes), the CUDA
     engine, the overrides. */}}
{{- define "appliance.batchSettings" -}}
{{- $args := list (printf "output=\"/data/%s\"" .Values.batch.output) -}}
{{- if not .Values.batch.search -}}{{- $args = append $args "overwrite=true" -}}{{- end -}}
{{- concat $args (include "appliance.gpuOverrides" . | fromJsonArray) .Values.overrides | toJson -}}
{{- end -}}

{{/* batch.search as `search.KEY=VALUE` words, as a JSON list (keys in order): strings double-quoted for
     Hydra (values.schema.json keeps quotes, backslashes and `$` out of them), lists in brackets. */}}
{{- define "appliance.searchSettings" -}}
{{- $args := list -}}
{{- range $key, $value := .Values.batch.search -}}
{{- $words := list -}}
{{- range (ternary $value (list $value) (kindIs "slice" $value)) -}}
{{- $words = append $words (ternary (printf "\"%s\"" .) (printf "%v" .) (kindIs "string" .)) -}}
{{- end -}}
{{- $args = append $args (printf "search.%s=%s" $key (ternary (printf "[%s]" (join "," $words)) (first $words) (kindIs "slice" $value))) -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}

{{/* The shares of a search: one per index of the Job (batch.parallelism). */}}
{{- define "appliance.searchShares" -}}
{{- printf "search.shares=%d" (int .Values.batch.parallelism) -}}
{{- end -}}

{{/* What each index of a search's Job runs, as a JSON list: `run` over its share (the index is the pod's
     $JOB_COMPLETION_INDEX). */}}
{{- define "appliance.searchRunArgs" -}}
{{- concat (list "run" (printf "pipeline=%s" .Values.pipeline)) (include "appliance.searchSettings" . | fromJsonArray)
      (list (include "appliance.searchShares" .)) (include "appliance.batchSettings" . | fromJsonArray) | toJson -}}
{{- end -}}

{{/* What the assemble Job runs, as a JSON list: the shares' search and output, the overrides (a region
     stage's options among them); no CUDA engine: assemble loads no model. */}}
{{- define "appliance.assembleArgs" -}}
{{- concat (list "assemble" (printf "pipeline=%s" .Values.pipeline)) (include "appliance.searchSettings" . | fromJsonArray)
      (list (include "appliance.searchShares" .) (printf "output=\"/data/%s\"" .Values.batch.output))
      .Values.overrides | toJson -}}
{{- end -}}

{{/* `check`'s arguments, as a JSON list: the workload's own with the verb `check` (batch mode: `run`'s
     over every input, or over the whole search: `check` lists every scene it finds), so that `helm test`
     checks the command line the pods run. */}}
{{- define "appliance.checkArgs" -}}
{{- $args := list "check" (printf "pipeline=%s" .Values.pipeline) -}}
{{- if and (eq .Values.mode "batch") .Values.batch.search -}}
{{- $args = concat $args (include "appliance.searchSettings" . | fromJsonArray)
      (include "appliance.batchSettings" . | fromJsonArray) -}}
{{- else if eq .Values.mode "batch" -}}
{{- $args = concat $args (list (include "appliance.inputArg" .Values.batch.inputs))
      (include "appliance.batchSettings" . | fromJsonArray) -}}
{{- else -}}
{{- $args = concat $args (include "appliance.serveSettings" . | fromJsonArray) -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}

{{/* A word for /bin/sh: single-quoted, its single quotes escaped. */}}
{{- define "appliance.shellQuote" -}}
{{- printf "'%s'" (replace "'" "'\\''" .) -}}
{{- end -}}

{{/* The series the server names `vllm:*` with metrics.names=vllm (appliance/serving/metrics.py VLLM_SERIES),
     as a JSON list. */}}
{{- define "appliance.vllmSeries" -}}
{{- list "time_to_first_token_seconds" "inter_token_latency_seconds" "e2e_request_latency_seconds"
      "request_queue_time_seconds" "request_prefill_time_seconds" "request_decode_time_seconds"
      "request_inference_time_seconds" "request_time_per_output_token_seconds" "request_prompt_tokens"
      "request_generation_tokens" "num_requests_running" "num_requests_waiting" "kv_cache_usage_perc"
      "prompt_tokens" "generation_tokens" "request_success" "num_preemptions" "prefix_cache_queries"
      "prefix_cache_hits" "request_params_max_tokens" "request_params_n" "request_max_num_generation_tokens" "iteration_tokens_total" "cache_config_info" | toJson -}}
{{- end -}}

{{/* A series' name as the server exports it under metrics.names. Takes (list $ "series"). */}}
{{- define "appliance.metricName" -}}
{{- $root := index . 0 -}}{{- $series := index . 1 -}}
{{- if and (eq $root.Values.metrics.names "vllm") (has $series (include "appliance.vllmSeries" $root | fromJsonArray)) -}}
vllm:{{ $series }}
{{- else -}}
appliance_{{ $series }}
{{- end -}}
{{- end -}}
