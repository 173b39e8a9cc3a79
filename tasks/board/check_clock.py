"""``odl board check``'s clock item: the board's clock against the host's, read over SSH halfway
through a round trip, and the verdict on the skew."""

from __future__ import annotations

import re

from tasks.board.check_items import PASS, WARN, Check, fail

SKEW_WARN_S, SKEW_FAIL_S = 1.0, 5.0


def parse_date(text: str) -> tuple[float, float]:
    """The board's ``date +%s.%N`` as (seconds, resolution); BusyBox without %N gives whole seconds."""
    match = re.match(r"\s*(\d+)(?:\.(\d+))?", text)
    if not match:
        raise ValueError(f"not a time: {text.strip()[:60]!r}")
    if match.group(2):
        return float(f"{match.group(1)}.{match.group(2)}"), 10.0 ** -len(match.group(2))
    return float(match.group(1)) + 0.5, 1.0  # the middle of the second it printed


def clock_skew(
    sent: float, received: float, board_time: float, resolution: float = 0.0
) -> tuple[float, float]:
    """(board minus host seconds, uncertainty): the board read its clock halfway through the round trip."""
    return board_time - (sent + received) / 2.0, (received - sent) / 2.0 + resolution / 2.0


def judge_clock(skew: float, uncertainty: float) -> Check:
    """|skew| up to SKEW_WARN_S passes, up to SKEW_FAIL_S warns, above fails."""
    side = "ahead of" if skew >= 0 else "behind"
    value = f"board clock {abs(skew):.3f} s {side} the host (+-{uncertainty:.3f} s)"
    fix = (
        "enable time sync on the board (timedatectl set-ntp true with systemd-timesyncd, or install chrony "
        "and point it at your NTP server; once: date -s @EPOCH), and check the host's own clock "
        "(timedatectl status): TLS certificates, logs and schedules need the right time"
    )
    if abs(skew) > SKEW_FAIL_S:
        return fail("clock", f"{value} > {SKEW_FAIL_S:.0f} s", fix)
    if abs(skew) > SKEW_WARN_S:
        return Check("clock", WARN, f"{value} > {SKEW_WARN_S:.0f} s", fix)
    return Check("clock", PASS, value)
