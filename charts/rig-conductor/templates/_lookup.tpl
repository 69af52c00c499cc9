{{/*
The data of the chart's own Secret as it is in the cluster now (base64 values,
JSON), {} when there is none. `helm template` and `helm lint` have no cluster:
lookup answers nothing there and the chart generates fresh tokens. A file of its
own so the chart tests can stand in for the cluster (tests/chart/test_tokens.py).
*/}}
{{- define "rig-conductor.currentSecretData" -}}
{{- $found := lookup "v1" "Secret" .Release.Namespace (include "rig-conductor.fullname" .) }}
{{- if and $found $found.data }}
{{- $found.data | toJson }}
{{- else }}
{{- dict | toJson }}
{{- end }}
{{- end }}
