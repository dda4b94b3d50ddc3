"""The BlackwellTrainingJob operator: planner, renderer, Kopf handlers and the `btj` CLI."""

__version__ = "0.1.0"
