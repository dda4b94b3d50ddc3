"""The calibration harness: grid, worker, scheduler and its command line (harness.py)."""
