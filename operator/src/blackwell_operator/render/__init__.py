"""Pure rendering: a plan and a spec to the children the operator creates, and the CRD from the models."""

from blackwell_operator.render.children import render_children, sha256_of
from blackwell_operator.render.labels import strip_tracking_labels
from blackwell_operator.render.pod import plan_config_map_name
from blackwell_operator.render.yamlio import dump_documents, dump_yaml

__all__ = [
    "dump_documents",
    "dump_yaml",
    "plan_config_map_name",
    "render_children",
    "sha256_of",
    "strip_tracking_labels",
]
