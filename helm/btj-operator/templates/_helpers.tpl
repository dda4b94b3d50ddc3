{{/*
Names and labels of the btj-operator chart. Every name is truncated to 63 characters (the DNS
label limit) with any trailing "-" trimmed; each resource kind has its own helper.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "btj-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: fullnameOverride, or "<release>-<chart>" (just the release when it already
contains the chart name), truncated to 63 characters.
*/}}
{{- define "btj-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "name-version" for the helm.sh/chart label. */}}
{{- define "btj-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator pod (stable across upgrades: never add the version here). */}}
{{- define "btj-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "btj-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The standard app.kubernetes.io labels on every object of the chart. */}}
{{- define "btj-operator.labels" -}}
helm.sh/chart: {{ include "btj-operator.chart" . }}
{{ include "btj-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: blackwell-training-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator Deployment. */}}
{{- define "btj-operator.deploymentName" -}}
{{- include "btj-operator.fullname" . }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "btj-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "btj-operator.fullname" .) .Values.serviceAccount.name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ClusterRole (and its binding) for cluster-scoped and, cluster-wide, all permissions. */}}
{{- define "btj-operator.clusterRoleName" -}}
{{- include "btj-operator.fullname" . }}
{{- end }}

{{/* The Role (and its binding) in each watched namespace when the operator is namespaced. */}}
{{- define "btj-operator.roleName" -}}
{{- include "btj-operator.fullname" . }}
{{- end }}

{{/* The metrics Service. */}}
{{- define "btj-operator.serviceName" -}}
{{- printf "%s-metrics" (include "btj-operator.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The operator's PodMonitor / ServiceMonitor. */}}
{{- define "btj-operator.monitorName" -}}
{{- include "btj-operator.fullname" . }}
{{- end }}

{{/* The PodMonitor for trainer pods. */}}
{{- define "btj-operator.trainerPodMonitorName" -}}
{{- printf "%s-trainers" (include "btj-operator.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* The PrometheusRule of the training alerts. */}}
{{- define "btj-operator.prometheusRuleName" -}}
{{- printf "%s-training" (include "btj-operator.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* The Grafana dashboard ConfigMap. */}}
{{- define "btj-operator.dashboardName" -}}
{{- printf "%s-dashboard" (include "btj-operator.fullname" . | trunc 53 | trimSuffix "-") }}
{{- end }}

{{/* The Argo CD health-check ConfigMap. */}}
{{- define "btj-operator.argocdHealthName" -}}
{{- printf "%s-argocd-health" (include "btj-operator.fullname" . | trunc 49 | trimSuffix "-") }}
{{- end }}

{{/* The operator image reference. */}}
{{- define "btj-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The default trainer image: what the operator runs for a BlackwellTrainingJob that names none. */}}
{{- define "btj-operator.trainerImage" -}}
{{- printf "%s:%s" .Values.trainerImage.repository (default .Chart.AppVersion .Values.trainerImage.tag) }}
{{- end }}

{{/* The namespaces the operator serves in namespaced mode (the default): the list, which validateConfig
requires and keeps clear of the release namespace unless operator.serveOwnNamespace. */}}
{{- define "btj-operator.watchedNamespaces" -}}
{{- toJson (default (list) .Values.operator.watchNamespaces) }}
{{- end }}

{{/* Cluster-wide, the namespaces left out: operator.excludeNamespaces, and the release namespace (the
operator's own) unless operator.serveOwnNamespace. */}}
{{- define "btj-operator.excludedNamespaces" -}}
{{- $excluded := default (list) .Values.operator.excludeNamespaces }}
{{- if and (not .Values.operator.serveOwnNamespace) (not (has .Release.Namespace $excluded)) }}
{{- $excluded = append $excluded .Release.Namespace }}
{{- end }}
{{- toJson $excluded }}
{{- end }}

{{/* `btj run`'s namespace arguments: one per watched namespace; cluster-wide, one Kopf pattern leaving the
excluded namespaces out ("!a,!b" matches every namespace but those), or none when nothing is excluded. */}}
{{- define "btj-operator.namespaceArgs" -}}
{{- $args := list }}
{{- if .Values.operator.clusterWide }}
{{- with (include "btj-operator.excludedNamespaces" . | fromJsonArray) }}
{{- $globs := list }}
{{- range . }}{{- $globs = append $globs (printf "!%s" .) }}{{- end }}
{{- $args = append $args (printf "--namespace=%s" (join "," $globs)) }}
{{- end }}
{{- else }}
{{- range (include "btj-operator.watchedNamespaces" . | fromJsonArray) }}
{{- $args = append $args (printf "--namespace=%s" .) }}
{{- end }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{/* Whether Kopf observes namespaces: whenever it serves patterns or names rather than the whole cluster. */}}
{{- define "btj-operator.observesNamespaces" -}}
{{- if or (not .Values.operator.clusterWide) (include "btj-operator.excludedNamespaces" . | fromJsonArray) }}true{{- end }}
{{- end }}

{{/* Fails the render on value combinations the schema cannot express. */}}
{{- define "btj-operator.validateConfig" -}}
{{- if and .Values.operator.clusterWide .Values.operator.watchNamespaces }}
{{- fail "operator.clusterWide and operator.watchNamespaces both set the operator's scope: set one of them" }}
{{- end }}
{{- if not (or .Values.operator.clusterWide .Values.operator.watchNamespaces) }}
{{- fail (printf "operator.watchNamespaces is empty: list the namespaces whose BlackwellTrainingJobs the operator serves, e.g. --set operator.watchNamespaces='{hyperpod-ns-team-a}' (the teams' namespaces, not the operator's own %s), or set operator.clusterWide=true" .Release.Namespace) }}
{{- end }}
{{- range .Values.operator.watchNamespaces }}
{{- if has . (list "kube-system" "kube-public" "kube-node-lease") }}
{{- fail (printf "operator.watchNamespaces: %s is a system namespace, where the operator never acts; remove it" .) }}
{{- end }}
{{- if and (eq . $.Release.Namespace) (not $.Values.operator.serveOwnNamespace) }}
{{- fail (printf "operator.watchNamespaces: %s is the operator's own namespace, which serves no BlackwellTrainingJobs by default (docs/security.md); remove it, or set operator.serveOwnNamespace=true" .) }}
{{- end }}
{{- end }}
{{- /* The release namespace gets the operator's own writes in every mode (the calibration Role: ConfigMap
create and patch). */}}
{{- if has .Release.Namespace (list "kube-system" "kube-public" "kube-node-lease") }}
{{- fail (printf "the release namespace %s is a system namespace, where the operator never acts: install it into a namespace of its own (e.g. -n btj-system)" .Release.Namespace) }}
{{- end }}
{{- if and .Values.metrics.podMonitor.enabled .Values.metrics.serviceMonitor.enabled }}
{{- fail "metrics.podMonitor.enabled and metrics.serviceMonitor.enabled both scrape the operator: enable one of them" }}
{{- end }}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) }}
{{- fail "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" }}
{{- end }}
{{- end }}

{{/* The cluster calibration's Role and RoleBinding: the role name, shortened so that the suffix fits 63. */}}
{{- define "btj-operator.calibrationRoleName" -}}
{{- include "btj-operator.roleName" . | trunc 51 | trimSuffix "-" }}-calibration
{{- end }}

{{/* The pre-delete hook Job (`btj release-children`): its own component, so that neither the operator's
Deployment, its Service nor its monitors select the hook's pod. */}}
{{- define "btj-operator.releaseChildrenName" -}}
{{- printf "%s-release-children" (include "btj-operator.fullname" . | trunc 45 | trimSuffix "-") }}
{{- end }}

{{- define "btj-operator.releaseChildrenLabels" -}}
helm.sh/chart: {{ include "btj-operator.chart" . }}
app.kubernetes.io/name: {{ include "btj-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: release-children
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: blackwell-training-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The namespace check (docs/install.md, "A job no operator serves"). In each served namespace a Role and
RoleBinding give the marker ServiceAccount the verb `serve` on BlackwellTrainingJobs: a verb nothing in
Kubernetes acts on, for a ServiceAccount no pod runs as. Every release of the chart binds the same name, so
the API server's own authorizer can answer, for any namespace, "does some release serve it?". */}}
{{- define "btj-operator.servedMarkerName" -}}
{{- printf "%s-served" (include "btj-operator.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{/* The marker's ServiceAccount name: the same in every release and chart version (never change it). */}}
{{- define "btj-operator.servedMarkerAccount" -}}
btj-served-marker
{{- end }}

{{/* The ValidatingAdmissionPolicy (and its binding) that warns about a BTJ no release serves. */}}
{{- define "btj-operator.unservedPolicyName" -}}
{{- printf "%s-unserved-namespace" (include "btj-operator.fullname" . | trunc 44 | trimSuffix "-") }}
{{- end }}

{{/* "true" when the namespace check is rendered: namespaced mode, enabled, and a Kubernetes with
ValidatingAdmissionPolicy v1 (1.30; `helm template` assumes its own client's version unless given
--kube-version: its offline capabilities list API versions, not kinds). */}}
{{- define "btj-operator.warnsUnserved" -}}
{{- if and .Values.unservedNamespaceWarning.enabled (not .Values.operator.clusterWide) (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) }}true{{- end }}
{{- end }}

{{- define "btj-operator.servedMarkerLabels" -}}
helm.sh/chart: {{ include "btj-operator.chart" . }}
app.kubernetes.io/name: {{ include "btj-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: served-namespace
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: blackwell-training-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
