"""``python -m docs.gen [FOLDER]``: write the generated reference into FOLDER (default docs/reference/)."""

from __future__ import annotations

import sys
from pathlib import Path

from docs.gen import REFERENCE, write

if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else REFERENCE):
        print(path)
