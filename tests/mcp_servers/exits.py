"""An MCP server that cannot start: it says why on stderr and exits."""

import sys

print("starting the notes server", file=sys.stderr)
print("fatal: cannot open /nonexistent/notes.db", file=sys.stderr)
sys.exit(2)
