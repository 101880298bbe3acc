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
The operator's rules: exactly the requests omni_operator (k8s.py, handlers.py) and kopf make, the
same for the namespaced Role and the ClusterRole. Children are listed by label on every reconcile
(list), written with server-side apply (patch, plus create for objects that do not exist yet) and
deleted when a worker is replaced or scaled away (delete). kopf watches the OmniDeployments, pods
and services (watch); nothing is read by name except the peering object.
*/}}
{{- define "omni-operator.rules" -}}
# The custom resource: watched by kopf, which also patches it (its finalizer and progress
# annotations); the operator writes the status through the status subresource.
- apiGroups: ["omni.dev"]
  resources: ["omnideployments"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["omni.dev"]
  resources: ["omnideployments/status"]
  verbs: ["patch"]
# Stage pods and worker/router Services: also watched (their events trigger a reconcile). `get` is
# there only because the router's Role grants it (see below).
- apiGroups: [""]
  resources: ["pods", "services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The other children of an OmniDeployment (render/): the config, the router's ServiceAccount,
# Role, RoleBinding, Deployment and disruption budget, and one NetworkPolicy per worker.
- apiGroups: [""]
  resources: ["configmaps", "serviceaccounts"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "create", "patch", "delete"]
# The router's Role grants get/list/watch on pods, services and endpointslices, and patch on
# services (its session reports on draining workers). Kubernetes lets a subject grant only what it
# holds itself, so the operator holds those too (endpointslices it never reads); this avoids the
# far broader `escalate` and `bind` verbs.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
# Events about reconciliation (the operator's own, and kopf's warnings).
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
