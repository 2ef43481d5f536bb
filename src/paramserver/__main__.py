"""``python -m paramserver``: the same as the ``paramserver`` command."""

import sys

from .cli import main

sys.exit(main())
