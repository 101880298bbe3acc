{{/*
Names, labels and the operator's RBAC rules, defined once and used by every template.
*/}}

{{- define "omni-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped name: the release name alone when it already contains the chart name. */}}
{{- define "omni-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "omni-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "omni-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "omni-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "omni-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "omni-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "omni-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespace the operator watches (ignored with watchAllNamespaces). */}}
{{- define "omni-operator.watchNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace }}
{{- end }}

{{- define "omni-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The operator's rules: exactly the resources and verbs it uses, the same for the namespaced Role
and the ClusterRole. Children are written with server-side apply (patch), read back through watches
(get, list, watch), and deleted when a worker is replaced or scaled away (delete).
*/}}
{{- define "omni-operator.rules" -}}
# The custom resource: watched, annotated by kopf (its progress and finalizer live in metadata),
# and its status written through the status subresource.
- apiGroups: ["omni.dev"]
  resources: ["omnideployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["omni.dev"]
  resources: ["omnideployments/status"]
  verbs: ["get", "patch"]
# Children of an OmniDeployment (render/): stage pods, worker and router Services, the config,
# the router's Deployment, disruption budget, NetworkPolicies and the router's ServiceAccount.
- apiGroups: [""]
  resources: ["pods", "services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The router's Role and RoleBinding (read-only on pods, services and endpointslices). Kubernetes
# lets a subject grant only what it holds itself, so the operator also reads endpointslices, which
# it otherwise never touches; this avoids the far broader `escalate` and `bind` verbs.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# Events about reconciliation (kopf's handler events and the operator's own).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* kopf peering: the replicas' keep-alives live in the peering object's status. kopf lists and
watches every peering object of its scope (RBAC cannot narrow a plain list by name) and writes
only the named one. */}}
{{- define "omni-operator.peeringRules" -}}
{{- $resource := ternary "clusterkopfpeerings" "kopfpeerings" .Values.watchAllNamespaces -}}

- apiGroups: ["kopf.dev"]
  resources: [{{ $resource | quote }}]
  verbs: ["list", "watch"]
- apiGroups: ["kopf.dev"]
  resources: [{{ $resource | quote }}]
  resourceNames: [{{ .Values.leaderElection.peeringName | quote }}]
  verbs: ["get", "patch"]
{{- end }}
