"""Byte units: binary for memory and request sizes, the decimal gigabyte for checkpoints and bandwidth."""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
# GPU and host memory, as nvidia-smi, torch and Kubernetes' `Gi` count it.
GIB = 1 << 30
# Checkpoint sizes and transfer rates, as S3 and disk vendors count them.
GB = 10**9
