"""The agent's stdout: JSON lines only, one object per answer (logs go to stderr and ``agent.log``)."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(obj: dict[str, Any]) -> None:
    """Print one JSON line on stdout."""
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()
