"""``slime-strands inspect``: a trajectory token by token, in a terminal or as an HTML page."""
