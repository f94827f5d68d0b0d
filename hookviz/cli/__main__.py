"""``python -m hookviz.cli``: the ``hookviz`` command."""

import sys

from . import main

sys.exit(main())
