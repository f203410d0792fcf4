{{- /* The app's name (label app.kubernetes.io/name, and the names' default). */ -}}
{{- define "perago.appName" -}}
{{- .Values.nameOverride | default "perago-operator" | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- /* The objects' name; 52 characters leave room for the longest suffix (-webhook-tls). */ -}}
{{- define "perago.name" -}}
{{- .Values.fullnameOverride | default (include "perago.appName" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- /* The name of cluster-scoped objects (ClusterRole and its binding, the webhook
configuration): in namespaced mode the release namespace is added, so that releases in several
namespaces of one cluster do not share them. */ -}}
{{- define "perago.clusterName" -}}
{{- if .Values.watchNamespaces -}}
{{- printf "%s-%s" (include "perago.name" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- include "perago.name" . -}}
{{- end -}}
{{- end -}}
{{- define "perago.labels" -}}
app.kubernetes.io/name: {{ include "perago.appName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "perago.selector" -}}
app.kubernetes.io/name: {{ include "perago.appName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- /* An image reference: repository:tag (the tag defaults to the appVersion), @digest when a
digest is set, as released charts set it. Called with (dict "image" <values> "chart" .Chart). */ -}}
{{- define "perago.image" -}}
{{- $reference := printf "%s:%s" .image.repository (.image.tag | default .chart.AppVersion) -}}
{{- if .image.digest }}{{ printf "%s@%s" $reference .image.digest }}{{ else }}{{ $reference }}{{ end -}}
{{- end -}}
