"""``ROOT/pull/config.json`` (mode 0600): the endpoint a pull-mode board dials, the pin of its
certificate, the board's name and its enrolment state, written by ``enrol`` and read by ``pull``.

Each field is checked where it is read, and a wrong one is one line naming it and what was expected:
``endpoint`` an ``https://HOST[:PORT]`` URL (no path: the routes are the contract's), ``pin``
``sha256:`` and 64 lowercase hex digits (:data:`~device_agent.pull.contract.PIN_RE`), ``name`` a
board name (:data:`~device_agent.names.NAME`), ``state`` ``pending`` or ``accepted``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from device_agent.errors import AgentError
from device_agent.names import NAME
from device_agent.protocol import ExitCode
from device_agent.pull.contract import PIN_RE
from device_agent.pull.identity import pull_dir, write_private

CONFIG_NAME = "config.json"
STATES = ("pending", "accepted")


def _bad(line: str, field: str) -> AgentError:
    return AgentError(ExitCode.INVALID_ARGUMENT, line, field)


def check_endpoint(url: object) -> tuple[str, int]:
    """``(host, port)`` of an ``https://HOST[:PORT]`` URL, else INVALID_ARGUMENT naming it."""
    expected = f"endpoint: expected https://HOST[:PORT] with no path (got {url!r})"
    if not isinstance(url, str):
        raise _bad(expected, "endpoint")
    try:
        parts = urlsplit(url)
        port = parts.port or 443
    except ValueError:
        raise _bad(expected, "endpoint") from None
    if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise _bad(expected, "endpoint")
    return parts.hostname, port


def check_pin(pin: object) -> str:
    """``pin`` when it is ``sha256:<64 lowercase hex>``, else INVALID_ARGUMENT naming it."""
    if not isinstance(pin, str) or not PIN_RE.match(pin):
        raise _bad(f"pin: expected sha256: and 64 lowercase hex digits (got {pin!r})", "pin")
    return pin


@dataclass(frozen=True)
class PullConfig:
    """What ``enrol`` stored: the endpoint, its certificate's pin, the board's name and state."""

    endpoint: str
    pin: str
    name: str
    state: str = "pending"

    def __post_init__(self) -> None:
        check_endpoint(self.endpoint)
        check_pin(self.pin)
        NAME.check(self.name, "name", error=lambda line: _bad(line, "name"))
        if self.state not in STATES:
            raise _bad(f"state: expected one of {', '.join(STATES)} (got {self.state!r})", "state")

    @property
    def url(self) -> str:
        """The endpoint without a trailing slash."""
        return self.endpoint.rstrip("/")

    def with_state(self, state: str) -> PullConfig:
        return replace(self, state=state)


def config_path(root: Path) -> Path:
    return pull_dir(root) / CONFIG_NAME


def save_config(root: Path, config: PullConfig) -> None:
    """Write ``ROOT/pull/config.json`` whole, mode 0600."""
    write_private(config_path(root), (json.dumps(asdict(config), indent=2, sort_keys=True) + "\n").encode())


def load_config(root: Path) -> PullConfig | None:
    """The stored configuration, None when the board never enrolled; a malformed file is one line."""
    path = config_path(root)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return PullConfig(**{k: data[k] for k in ("endpoint", "pin", "name", "state") if k in data})
    except (ValueError, TypeError) as exc:
        raise _bad(f"{path}: expected the JSON object `enrol` writes ({exc}): enrol again", "config") from exc
