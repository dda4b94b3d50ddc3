"""``python -m blackwell_trainer --plan PATH``: run the trainer on a plan file."""

from blackwell_trainer.train import main

raise SystemExit(main())
