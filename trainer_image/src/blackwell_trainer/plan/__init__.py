"""The wire models: the plan, the prepared data's manifest, metric names, switches (torch-free: the
operator imports them)."""
