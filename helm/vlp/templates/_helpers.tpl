{{/* Names ------------------------------------------------------------------------------------------------------- */}}

{{- define "vlp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vlp.fullname" -}}
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

{{- define "vlp.mlflow.fullname" -}}
{{- printf "%s-mlflow" (include "vlp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vlp.reevaluation.fullname" -}}
{{- printf "%s-reevaluation" (include "vlp.fullname" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/* The InferenceService: KServe appends "-predictor" and more to it, so it stays short. */}}
{{- define "vlp.serving.fullname" -}}
{{- default (printf "%s-search" (include "vlp.fullname" .)) .Values.serving.name | trunc 45 | trimSuffix "-" -}}
{{- end -}}

{{- define "vlp.serving.serviceAccountName" -}}
{{- default (printf "%s-serving" (include "vlp.fullname" .)) .Values.serviceAccounts.serving.name -}}
{{- end -}}

{{- define "vlp.mlflow.serviceAccountName" -}}
{{- default (include "vlp.mlflow.fullname" .) .Values.serviceAccounts.mlflow.name -}}
{{- end -}}

{{- define "vlp.reevaluation.serviceAccountName" -}}
{{- default (include "vlp.reevaluation.fullname" .) .Values.serviceAccounts.reevaluation.name -}}
{{- end -}}

{{/* Labels ------------------------------------------------------------------------------------------------------ */}}

{{- define "vlp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vlp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vlp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "vlp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vlp
{{- end -}}

{{/* Image ------------------------------------------------------------------------------------------------------- */}}

{{- define "vlp.image" -}}
{{- $repo := printf "%s/%s" .Values.image.registry .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Object storage ---------------------------------------------------------------------------------------------- */}}

{{/* The endpoint as a URL for boto3/MLflow: the scheme follows objectStore.disableSSL. */}}
{{- define "vlp.objectStore.url" -}}
{{- if contains "://" .Values.objectStore.endpoint -}}
{{- fail "objectStore.endpoint takes host[:port] without a scheme (the scheme follows objectStore.disableSSL)" -}}
{{- end -}}
{{- printf "%s://%s" (ternary "http" "https" .Values.objectStore.disableSSL) .Values.objectStore.endpoint -}}
{{- end -}}

{{/* The endpoint's TCP port: explicit host:port, else 80/443 from disableSSL. */}}
{{- define "vlp.objectStore.port" -}}
{{- $parts := splitList ":" .Values.objectStore.endpoint -}}
{{- if eq (len $parts) 2 -}}
{{- last $parts -}}
{{- else -}}
{{- ternary "80" "443" .Values.objectStore.disableSSL -}}
{{- end -}}
{{- end -}}

{{/* Environment of every container that talks to S3: endpoint/region from values, keys from the Secret only. */}}
{{- define "vlp.objectStore.env" -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.objectStore.existingSecret.name }}
      key: {{ .Values.objectStore.existingSecret.accessKeyKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.objectStore.existingSecret.name }}
      key: {{ .Values.objectStore.existingSecret.secretKeyKey }}
- name: AWS_ENDPOINT_URL
  value: {{ include "vlp.objectStore.url" . | quote }}
- name: MLFLOW_S3_ENDPOINT_URL
  value: {{ include "vlp.objectStore.url" . | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ .Values.objectStore.region | quote }}
- name: AWS_REGION
  value: {{ .Values.objectStore.region | quote }}
{{- end -}}

{{/* MLflow ------------------------------------------------------------------------------------------------------ */}}

{{/*
Host headers MLflow accepts (it compares them exactly): the Service's DNS names, each with the Service port, plus
localhost with that port (kubectl port-forward). On port 80 HTTP clients leave the port out of the Host header, so
the names are then accepted without it too.
*/}}
{{- define "vlp.mlflow.allowedHosts" -}}
{{- $svc := include "vlp.mlflow.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $port := int .Values.mlflow.service.port -}}
{{- $hosts := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) "localhost" -}}
{{- $out := list -}}
{{- range $hosts -}}
{{- $out = append $out (printf "%s:%d" . $port) -}}
{{- end -}}
{{- if eq $port 80 -}}
{{- $out = concat $out $hosts -}}
{{- end -}}
{{- concat $out .Values.mlflow.extraAllowedHosts | join "," -}}
{{- end -}}

{{- define "vlp.mlflow.url" -}}
{{- printf "http://%s.%s.svc.%s:%d" (include "vlp.mlflow.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.mlflow.service.port) -}}
{{- end -}}

{{/* KFP API ----------------------------------------------------------------------------------------------------- */}}

{{- define "vlp.kfp.port" -}}
{{- $u := urlParse .Values.reevaluation.kfp.host -}}
{{- if not (has $u.scheme (list "http" "https")) -}}
{{- fail (printf "reevaluation.kfp.host must be an http(s) URL like http://ml-pipeline.kubeflow.svc.cluster.local:8888, got %q" .Values.reevaluation.kfp.host) -}}
{{- end -}}
{{- $parts := splitList ":" $u.host -}}
{{- if eq (len $parts) 2 -}}
{{- last $parts -}}
{{- else -}}
{{- ternary "443" "80" (eq $u.scheme "https") -}}
{{- end -}}
{{- end -}}

{{/* Shared pod pieces ------------------------------------------------------------------------------------------- */}}

{{- define "vlp.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* emptyDir volumes behind the read-only root filesystem: /tmp and the home directory. */}}
{{- define "vlp.scratchVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .tmpSizeLimit | default "1Gi" }}
- name: home
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{- define "vlp.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/vlp
{{- end -}}

{{/* NetworkPolicy egress rule for cluster DNS. */}}
{{- define "vlp.networkPolicy.dns" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.networkPolicy.dns.namespace }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.podLabels | nindent 10 }}
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end -}}

{{/* NetworkPolicy egress rule for the object store: objectStorePorts (else the endpoint's port) to
objectStorePeers + objectStoreCIDRs (none = any address). */}}
{{- define "vlp.networkPolicy.objectStore" -}}
{{- $np := .Values.networkPolicy -}}
{{- $ports := $np.objectStorePorts | default (list (include "vlp.objectStore.port" .)) -}}
{{- $peers := $np.objectStorePeers | default list -}}
{{- range $np.objectStoreCIDRs -}}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" .)) -}}
{{- end -}}
- ports:
    {{- range $ports }}
    - port: {{ . | int }}
      protocol: TCP
    {{- end }}
  {{- with $peers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Egress rules of every pipeline step pod (networkPolicy.steps): DNS, the object store, MLflow, KFP's servers, the
API server and steps.extraEgress; a list of NetworkPolicyEgressRule at column 0, to nindent where it is included. */}}
{{- define "vlp.networkPolicy.stepEgress" -}}
{{- $np := .Values.networkPolicy -}}
{{ include "vlp.networkPolicy.dns" . }}
{{ include "vlp.networkPolicy.objectStore" . }}
{{- if .Values.mlflow.enabled }}
- to:
    - podSelector:
        matchLabels:
          {{- include "vlp.selectorLabels" . | nindent 10 }}
          app.kubernetes.io/component: mlflow
  ports:
    - port: {{ .Values.mlflow.port | int }}
      protocol: TCP
{{- end }}
- ports:
    {{- range $np.steps.kfpPorts }}
    - port: {{ . | int }}
      protocol: TCP
    {{- end }}
  {{- with $np.steps.kfpPeers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
- ports:
    {{- range $np.steps.apiServerPorts }}
    - port: {{ . | int }}
      protocol: TCP
    {{- end }}
  {{- with $np.steps.apiServerCIDRs }}
  to:
    {{- range . }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  {{- end }}
{{- with $np.steps.extraEgress }}
{{ toYaml . }}
{{- end }}
{{- end -}}
