"""``python -m slime_strands.cli``: the ``slime-strands`` command."""

import sys

from . import main

sys.exit(main())
