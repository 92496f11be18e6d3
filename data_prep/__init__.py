"""Dataset preparation for slime-strands: ``python -m data_prep.prepare --help``."""
