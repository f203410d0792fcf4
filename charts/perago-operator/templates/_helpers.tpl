{{- define "perago.name" -}}perago-operator{{- end -}}
{{- define "perago.labels" -}}
app.kubernetes.io/name: perago-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "perago.selector" -}}
app.kubernetes.io/name: perago-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
