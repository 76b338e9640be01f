{{/*
The documents of one of deploy/k8s's files (reached through the chart's `k8s` link), parsed,
as a JSON list (templates hand back text only).
*/}}
{{- define "tokengate.load" -}}
{{- $root := index . 0 -}}
{{- $docs := list -}}
{{- range splitList "\n---\n" ($root.Files.Get (printf "k8s/%s" (index . 1))) -}}
{{- $doc := fromYaml . -}}
{{- if $doc -}}{{- $docs = append $docs $doc -}}{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}
