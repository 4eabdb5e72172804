{{/* Pod parts shared by the Deployment (serve) and the Job (batch). Each takes the root context.

The root file system is read-only: the appliance writes its spool and Prometheus files under $TMPDIR,
the Hugging Face and Triton caches under /cache, shared memory (tensor-parallel workers, torch) under
/dev/shm, and in batch mode its outputs under /data. The CPU kernels the image built are read from
the image's $XDG_CACHE_HOME; a kernel that must be built at run time goes to $TMPDIR. */}}

{{- define "appliance.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "appliance.env" -}}
- name: TMPDIR
  value: /tmp
- name: HOME
  value: /tmp
- name: HF_HOME
  value: /cache/huggingface
- name: TRITON_CACHE_DIR
  value: /cache/triton
{{- if .Values.extraConfig }}
- name: APPLIANCE_EXTRA_CONF_DIR
  value: /etc/appliance/conf.d
{{- end }}
{{- if and (eq .Values.mode "serve") .Values.server.apiKey.existingSecret }}
- name: APPLIANCE_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.server.apiKey.existingSecret }}
      key: {{ .Values.server.apiKey.key }}
{{- end }}
{{- if eq .Values.mode "batch" }}
- name: JOB_COMPLETION_INDEX
  valueFrom:
    fieldRef:
      fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
{{- end }}
{{- end -}}

{{- define "appliance.resources" -}}
{{- $resources := deepCopy .Values.resources -}}
{{- if gt (int .Values.gpu.count) 0 -}}
{{- $limits := get $resources "limits" | default dict -}}
{{- $_ := set $limits .Values.gpu.resourceName (int .Values.gpu.count) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{- if $resources -}}{{- toYaml $resources -}}{{- end -}}
{{- end -}}

{{- define "appliance.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /cache
- name: dshm
  mountPath: /dev/shm
{{- if .Values.extraConfig }}
- name: extra-config
  mountPath: /etc/appliance/conf.d
  readOnly: true
{{- end }}
{{- if or .Values.model.existingClaim .Values.model.hostPath }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
  {{- with .Values.model.subPath }}
  subPath: {{ . }}
  {{- end }}
{{- end }}
{{- if eq .Values.mode "batch" }}
- name: data
  mountPath: /data
{{- end }}
{{- end -}}

{{- define "appliance.volumes" -}}
- name: tmp
  emptyDir: {}
- name: cache
  emptyDir: {}
- name: dshm
  emptyDir:
    medium: Memory
{{- if .Values.extraConfig }}
- name: extra-config
  configMap:
    name: {{ include "appliance.fullname" . }}-config
    items:
      {{- range $path, $_ := .Values.extraConfig }}
      - key: {{ include "appliance.configKey" $path }}
        path: {{ $path }}
      {{- end }}
{{- end }}
{{- if .Values.model.existingClaim }}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.existingClaim }}
    readOnly: true
{{- else if .Values.model.hostPath }}
- name: model
  hostPath:
    path: {{ .Values.model.hostPath }}
    type: Directory
{{- end }}
{{- if eq .Values.mode "batch" }}
- name: data
  persistentVolumeClaim:
    claimName: {{ .Values.batch.volume }}
{{- end }}
{{- end -}}

{{- define "appliance.podAnnotations" -}}
{{- if .Values.extraConfig }}
checksum/extra-config: {{ toJson .Values.extraConfig | sha256sum }}
{{- end }}
{{- end -}}
