"""Parallelism: rank and process group, FSDP2 or one device, context parallel, AC, precision."""
