"""The input bounds a manifest must meet, taken from the Kubernetes API server's own request limits."""

from __future__ import annotations

from blackwell_operator.units import MIB

# kube-apiserver refuses a request body over 3 MiB (k8s.io/apiserver, server/config.go,
# `MaxRequestBodyBytes = 3 * 1024 * 1024`), and kubectl sends a YAML manifest as JSON. So a file
# over 3 MiB, or one whose aliases expand to more than 3 MiB of JSON, can never be applied.
MAX_REQUEST_BYTES = 3 * MIB

# The API server's JSON decoder stops at 10000 levels of nesting (Go's encoding/json limit); Python's
# recursion limit is lower, and the CRD's deepest field is under 10 levels, so anything past 64 is
# rejected by the schema anyway: refuse it before it can recurse.
MAX_DEPTH = 64

# Values (YAML nodes) in one document. The CRD bounds every list a BTJ has (env 128, tolerations 64, pod
# labels 64, ...), so a real manifest holds a few thousand at most; reading 3 MiB of `[1,1,1,...]` (1.5
# million values) in pure Python would take minutes, so the reader stops here (only a manifest with tens
# of thousands of metadata labels, which no BTJ needs, is refused here but not by the API server).
MAX_NODES = 20_000
