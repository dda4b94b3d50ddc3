"""``python -m blackwell_trainer --plan PATH``: run the trainer on a plan file."""

# First, before anything registers an atexit handler: the process ends from the last one with main()'s
# code, never through the interpreter teardown that torch's gloo worker threads can abort (process_exit.py).
from blackwell_trainer.loop.process_exit import ProcessExit

process_exit = ProcessExit()

# The SIGTERM guard goes in before torch is imported (seconds, more on a loaded node): a preemption
# during start-up then ends in a clean exit 0 instead of SIGTERM's default, a silent kill.
from blackwell_trainer.loop.preemption import PreemptionGuard  # noqa: E402

guard = PreemptionGuard()

from blackwell_trainer.train import main  # noqa: E402  (after the guard, on purpose)

process_exit.run(lambda: main(guard=guard))
