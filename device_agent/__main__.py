"""``python3 -m device_agent``: see :mod:`device_agent.cli`."""

import sys

from device_agent.cli import main

sys.exit(main())
