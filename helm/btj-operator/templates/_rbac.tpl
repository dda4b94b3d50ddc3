{{/*
The operator's permissions, split by scope. Each rule says whether Kopf (framework) or the
operator's own code (application) needs it. tests/helm/test_rbac.py checks that the application
rules equal blackwell_operator.permissions.PERMISSIONS and that nothing else is granted beyond the
framework rules listed there. No wildcards anywhere.
*/}}

{{/* Rules on cluster-scoped resources: always in the ClusterRole. */}}
{{- define "btj-operator.rules.clusterScoped" -}}
# Framework: Kopf observes CRDs to resolve the resources it serves and notice them being added/removed.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if include "btj-operator.observesNamespaces" . }}
# Framework: with --namespace, Kopf lists and watches namespaces to match them against its patterns
# (kopf/_core/reactor/observation.py, namespace_observer); cluster-wide with nothing excluded it never
# reads namespaces.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
# Application: discovery lists node capacity (instance type, GPUs, HyperPod health label), and watches
# nodes to time each one's absence for elastic jobs; read-only.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
{{- if and .Values.operator.freeCapacity (not .Values.operator.clusterWide) }}
# Application (operator.freeCapacity): the pods bound to nodes in every namespace, listed (never watched,
# read, changed or deleted) to count the GPUs other workloads hold; of each pod only its node, namespace,
# job-name label and GPU requests are kept. Cluster-wide mode grants it with the namespaced rules.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- end }}
{{- end }}

{{/* Rules on namespaced resources: in the ClusterRole when cluster-wide, else in a Role per namespace. */}}
{{- define "btj-operator.rules.namespaced" -}}
# Application: the BlackwellTrainingJobs the operator reconciles (Kopf also patches its
# progress annotations and finalizer onto them).
- apiGroups: ["training.blackwell.dev"]
  resources: ["blackwelltrainingjobs"]
  verbs: ["get", "list", "watch", "patch"]
# Application: phase, conditions and the plan are written to the status subresource only.
- apiGroups: ["training.blackwell.dev"]
  resources: ["blackwelltrainingjobs/status"]
  verbs: ["patch"]
# Application (admission): children set blockOwnerDeletion on their owner reference, which the
# OwnerReferencesPermissionEnforcement admission plugin allows only with update on the owner's finalizers.
- apiGroups: ["training.blackwell.dev"]
  resources: ["blackwelltrainingjobs/finalizers"]
  verbs: ["update"]
# Application: the child Kubeflow PyTorchJob (created, patched on spec change, watched for status;
# deleted when a worker ends on a permanent error, so that retries do not hold its GPUs).
- apiGroups: ["kubeflow.org"]
  resources: ["pytorchjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Application: the child HyperPodPyTorchJob when spec.backend is HyperPodPyTorchJob (same verbs).
- apiGroups: ["sagemaker.amazonaws.com"]
  resources: ["hyperpodpytorchjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Application: the child Kubeflow Trainer v2 TrainJob when spec.backend is TrainJob (same verbs).
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Application: the per-job TrainingRuntime a TrainJob references (created before it, patched with it;
# deleted when the TrainJob's create is refused or the finished TrainJob is gone, else removed with the
# BlackwellTrainingJob through its owner reference).
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainingruntimes"]
  verbs: ["get", "create", "patch", "delete"]
# Application: the <name>-plan ConfigMap mounted into the trainer pods (deleted when its job's create
# is refused, or when its finished job is gone).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
# Application: trainer pods, watched (label-filtered) so that a failed worker's exit code and
# termination message reach the BlackwellTrainingJob's status.lastFailure; a trainer pod stuck
# Terminating on a gone or not-Ready node is force-deleted so that its replacement can start.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
# Application: a pod's result counts only when its controllers lead to the BlackwellTrainingJob's own
# child by uid; a TrainJob's pods are controlled by a Job of its JobSet, each read by name.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get"]
# Application: the JobSet between a TrainJob and its Jobs, read by name on the same check.
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get"]
# Application: the ServiceAccount a BlackwellTrainingJob's pods run as, read by name before its child
# is created (a missing one holds the create and says so in the BlackwellTrainingJob's status).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get"]
{{- if .Values.operator.checkImagePullSecrets }}
# Application (opt-in, operator.checkImagePullSecrets): the pull Secrets a spec names, read by name to
# warn when one is missing. RBAC cannot limit this to those names, so it is off by default.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# Framework and application: Kopf posts handler progress/errors as Events; the operator posts
# planning and admission Events on the BlackwellTrainingJob.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
