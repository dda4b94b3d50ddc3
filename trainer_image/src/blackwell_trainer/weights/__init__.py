"""Hugging Face weights: loaded into the sharded model, exported from it, where they are stored."""
