"""Downloads the upstream CRDs the render tests validate against into .tools/crd-schemas (SHA-256 checked)."""

from __future__ import annotations

import hashlib
import sys
import urllib.request
from pathlib import Path

GITHUB = "https://raw.githubusercontent.com"
# file name -> (where it is published, the SHA-256 of the copy the project's CI validates against).
# docs/reference/crd-schemas.md names each source; a file whose digest differs is not kept.
SCHEMAS = {
    "kubeflow.org_pytorchjobs.yaml": (
        f"{GITHUB}/kubeflow/training-operator/release-1.9/manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
        "eb80e57a984cdc7ceefaaf3fc561e21b673c30cbb58589f2389528d2b2760d22",
    ),
    "hyperpod-training-operator-v1.7.pytorchjobs.kubeflow.org.yaml": (
        f"{GITHUB}/aws/sagemaker-hyperpod-cli/main/helm_chart/HyperPodHelmChart/charts/training-operators/"
        "crds/pytorchjobs.kubeflow.org.yaml",
        "bc5144778e472f1b690d05dbf92b0143839bed777e9a27c7ead27ed7a1cfa2c5",
    ),
    "kubeflow-trainer-v2.3.0.trainer.kubeflow.org_trainjobs.yaml": (
        f"{GITHUB}/kubeflow/trainer/v2.3.0/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
        "a742cafc5b5582640c7e0b7467c024fc237256fbca5ba0a9f0531dfb66d64416",
    ),
    "kubeflow-trainer-v2.3.0.trainer.kubeflow.org_trainingruntimes.yaml": (
        f"{GITHUB}/kubeflow/trainer/v2.3.0/manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
        "69b8dbdf60a18e28cddcc2b8dfc4ce72a943e14b531b9389d593118faee4919f",
    ),
    "kubeflow-trainer-v2.3.0.trainer.kubeflow.org_clustertrainingruntimes.yaml": (
        f"{GITHUB}/kubeflow/trainer/v2.3.0/manifests/base/crds/"
        "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "ec84dc3388fcdbe8c61d3c247a773d14458dd9438e995bea8e50d2a18080eef9",
    ),
    "kubeflow-trainer-v2.3.0.runtime.torch-distributed.yaml": (
        f"{GITHUB}/kubeflow/trainer/v2.3.0/charts/kubeflow-trainer/templates/runtimes/torch-distributed.yaml",
        "996f8ec7e94e631d68bdcd96328c009304a21bdc5b7181c15cd3b817a52d5cde",
    ),
}


def fetch(dest: Path) -> list[str]:
    """Each schema not yet in `dest` downloaded and kept if its digest matches; the problems, one a line."""
    dest.mkdir(parents=True, exist_ok=True)
    problems = []
    for name, (url, digest) in SCHEMAS.items():
        target = dest / name
        if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == digest:
            continue
        try:
            with urllib.request.urlopen(url, timeout=60) as answer:
                body = answer.read()
        except OSError as err:
            problems.append(f"{name}: {url}: {err}")
            continue
        if hashlib.sha256(body).hexdigest() != digest:
            problems.append(f"{name}: {url} differs from the copy CI validates against (SHA-256)")
            continue
        target.write_bytes(body)
    return problems


if __name__ == "__main__":
    folder = Path(
        sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / ".tools/crd-schemas"
    )
    failed = fetch(folder)
    for line in failed:
        print(f"fetch_crd_schemas: {line}", file=sys.stderr)
    print(f"fetch_crd_schemas: {len(SCHEMAS) - len(failed)} of {len(SCHEMAS)} in {folder}")
    sys.exit(1 if failed else 0)
