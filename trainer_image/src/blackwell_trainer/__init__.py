"""The BlackwellTrainingJob trainer: FSDP2 + Transformer Engine, driven by a plan file."""

__version__ = "0.1.0"
