"""The training loop's components (train.py keeps the loop): the step, optimizer, checks, reports."""
