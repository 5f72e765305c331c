{{/* Every object's name: the prefix config/default uses (aiinference-) plus its role. */}}
{{- define "aii.prefix" -}}aiinference{{- end -}}
{{- define "aii.sa" -}}{{ include "aii.prefix" . }}-controller-manager{{- end -}}
{{- define "aii.webhookService" -}}{{ include "aii.prefix" . }}-webhook-service{{- end -}}
{{- define "aii.selector" -}}
app.kubernetes.io/name: aiinference-operator
{{- end -}}
{{- define "aii.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "aii.subjects" -}}
subjects:
  - kind: ServiceAccount
    name: {{ include "aii.sa" . }}
    namespace: {{ .Release.Namespace }}
{{- end -}}
