"""``python -m blackwell_trainer --plan PATH``: run the trainer on a plan file."""

# The SIGTERM guard goes in before torch is imported (seconds, more on a loaded node): a preemption
# during start-up then ends in a clean exit 0 instead of SIGTERM's default, a silent kill.
from blackwell_trainer.preemption import PreemptionGuard

guard = PreemptionGuard()

from blackwell_trainer.train import main  # noqa: E402  (after the guard, on purpose)

raise SystemExit(main(guard=guard))
