"""The operator's lifecycle logic, pure: a BTJ's phase, conditions, failures, re-plans, progress and
measurements from what the handlers read. Nothing here calls the API, reads the clock or the environment."""
