"""The job's distributed checkpoints: saved, verified, resumed, and when the loop saves them."""
