"""The hold hook of a job (a test hook): while ``JOBDIR/hold`` exists, the training loop pauses once
it has trained the step the file names, writes that step to ``JOBDIR/held`` and waits until the
file is removed or the job is cancelled. Faults are injected while a job waits there, so a test
never races a job's wall time (tests/e2e/faultkit.py)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
POLL_S = 0.05  # how often a paused job looks whether its hold file is gone


class Hold:
    """The hold file of one job: read at the cancel-poll cadence, compared with the step after each
    step (one integer comparison once a hold file has been seen)."""

    def __init__(self, hold_file: Path, held_file: Path) -> None:
        self.hold_file, self.held_file = str(hold_file), Path(held_file)
        self.at: int | None = None  # the step the hold file names

    def poll(self) -> None:
        """Read the hold file (an empty or unreadable one: pause at once); no file, no hold."""
        try:
            with open(self.hold_file) as fh:
                text = fh.read().strip()
        except OSError:
            self.at = None
            return
        try:
            self.at = int(text) if text else 0
        except ValueError:
            self.at = 0

    def due(self, step: int) -> bool:
        """Whether the job must pause after ``step``."""
        return self.at is not None and step >= self.at

    def wait(self, step: int, cancelled: Callable[[], bool]) -> None:
        """Pause at ``step`` until the hold file is gone or ``cancelled()`` says so."""
        self.held_file.write_text(str(step))
        log.info("held after step %d (remove %s to go on)", step, self.hold_file)
        while os.path.exists(self.hold_file) and not cancelled():
            time.sleep(POLL_S)
        self.held_file.unlink(missing_ok=True)
        self.at = None
        log.info("released at step %d", step)
