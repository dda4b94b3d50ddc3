"""The planner: a pure function from a BTJ spec and the catalogs to a tuned, explained Plan."""
