"""Benchmarks and the calibration harness, run from the repository root (`python -m benchmarks...`)."""
