"""The agent's one exception: carries the exit code (protocol.ExitCode) and a message."""

from __future__ import annotations

from device_agent.protocol import ExitCode


class AgentError(Exception):
    """A job cannot go on; ``code`` says why (grouped by cause), ``field`` names a bad input."""

    def __init__(self, code: ExitCode, message: str, field: str = "") -> None:
        self.code = ExitCode(code)
        self.field = field
        super().__init__(message)

    def to_dict(self) -> dict[str, object]:
        """The JSON form printed on stdout and stored in result.json/events."""
        d: dict[str, object] = {"exit_code": int(self.code), "error": str(self), "cause": self.code.name}
        if self.field:
            d["field"] = self.field
        return d
