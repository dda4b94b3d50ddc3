"""One home for the app.kubernetes.io label keys and this operator's values of them.

Everything the operator makes (children, their pods, the cluster calibration ConfigMap) and every Event it
posts is marked `app.kubernetes.io/managed-by: blackwell-operator`; the pod watch selects trainer pods by
it. tests/repo/test_one_home.py fails a module elsewhere that spells a key or the manager value. The chart's
own objects say `managed-by: Helm`, as Helm sets it.
"""

from __future__ import annotations

# app.kubernetes.io recommended labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
NAME_LABEL = "app.kubernetes.io/name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
PART_OF_LABEL = "app.kubernetes.io/part-of"
COMPONENT_LABEL = "app.kubernetes.io/component"
# Argo CD tracks resources by this label in `label` tracking mode (docs/reference/hyperpod-pytorchjob.md
# §3.2).
INSTANCE_LABEL = "app.kubernetes.io/instance"

# The values: the trainer's pods are the app, this operator manages them, both are part of one system.
APP_NAME = "blackwell-trainer"
MANAGER = "blackwell-operator"
PART_OF = "blackwell-training"
# The CRD's app.kubernetes.io/name: the operator as an installed application.
OPERATOR_APP_NAME = "blackwell-training-operator"
# The app.kubernetes.io keys the operator sets on every trainer pod itself (a spec may not set them).
OPERATOR_POD_LABELS = (NAME_LABEL, MANAGED_BY_LABEL, PART_OF_LABEL)
