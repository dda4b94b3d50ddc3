"""Calibration from measurements: run records, fitting constants, accuracy checks and reports (issue 6)."""
