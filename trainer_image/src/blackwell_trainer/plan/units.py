"""Byte units of the trainer, which imports nothing of the operator and so keeps its own."""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
# GPU memory as torch and its allocator's messages count it.
GIB = 1 << 30
TIB = 1 << 40
