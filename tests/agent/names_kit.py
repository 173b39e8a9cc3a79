"""Generated names for the name rule's tests (``device_agent.names``): the rule's alphabet, shell
and path metacharacters, names built from both, and a folder's tree to show nothing was created."""

from __future__ import annotations

import string
from pathlib import Path

from hypothesis import strategies as st

from device_agent.protocol import NAME, NAME_PATTERN

ALPHABET = string.ascii_letters + string.digits + "._-"
META = ["$", "(", ")", "`", ";", "|", "&", "\n", "\r", "\t", "\0", " ", "'", '"', "\\", "*", "?", "[",
        "~", "<", ">", "{", "}", "!", "#", "=", ":", "@", "+", ",", "%", "/", "..", "../", "$(touch x)",
        "\x7f", "é", "\u0663", "\u202e", "\uff0e\uff0e", "\u2024"]  # fmt: skip
safe_text = st.text(ALPHABET, max_size=12)
evil = st.one_of(
    st.builds(lambda a, m, b: a + m + b, safe_text, st.sampled_from(META), safe_text),
    st.builds(lambda lead, rest: lead + rest, st.sampled_from([".", "-", "_"]), safe_text),
    st.sampled_from(["", ".", "..", "-", "-rf", "x" * (NAME.max_len + 1)]),
)
good = st.from_regex(NAME_PATTERN, fullmatch=True).filter(lambda v: len(v) <= NAME.max_len)
mixed = st.one_of(evil, good, st.text(ALPHABET + "".join(m for m in META if len(m) == 1), max_size=16))


def tree(base: Path) -> list[tuple[str, bytes]]:
    """Every path under ``base`` with its bytes (b"" for folders)."""
    out = []
    for p in sorted(base.rglob("*")):
        out.append((str(p.relative_to(base)), p.read_bytes() if p.is_file() else b""))
    return out


def toml_str(value: str) -> str:
    """``value`` as a TOML basic string (control characters, quote and backslash escaped)."""
    body = "".join(c if " " <= c != "\x7f" and c not in '"\\' else f"\\u{ord(c):04x}" for c in value)
    return f'"{body}"'
