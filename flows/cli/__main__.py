"""``python -m flows.cli`` is the ``odl`` command."""

import sys

from flows.cli import main

sys.exit(main())
