"""``slime-strands eval``: the configured agent on every prompt of a dataset, without slime."""
