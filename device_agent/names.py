"""The one rule for every name that reaches a board or the project home: job ids, board and group
names, recipe (model) names, dataset folders, report names and the files pushed to a board.

A name is 1-128 characters of ASCII letters, digits, ``.``, ``_`` and ``-``, starting with a letter
or a digit and holding no ``..``: nothing a shell expands or splits (``$ ( ` ; | & * ? ~``,
spaces, quotes, newlines, NUL), nothing a path join reads as another folder (``/``, ``.``, ``..``)
and nothing a command reads as an option (a leading ``-``). A relative path (a dataset folder such
as ``datasets/cam/night1``) is names joined by ``/``; an absolute path is refused, never rebased.

Both sides use it: the host before it sends anything, the agent again on its own. A refusal is
one line, the same everywhere::

    <field> (<file> entry <entry>): '<value>' is not a valid name: <what is allowed>

(the part in parentheses only when the value comes from a file). Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from device_agent.wire import SpecError

# No lookaround, so JSON Schema and pydantic can use the pattern as is: a dot is always followed by
# a non-dot (or ends the name), which is what "no '..'" means; the length is bounded apart.
NAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9_-]|\.[A-Za-z0-9_-])*\.?$"
NAME_MAX = 128
PATH_MAX = 255  # a relative path of names, in all
NAME_ALLOWED = f"1-{NAME_MAX} characters of A-Z a-z 0-9 . _ -, starting with a letter or digit, no '..'"

Refuse = Callable[[str], Exception]  # builds the caller's own error from the refusal line


class BadName(SpecError):
    """A name refused by a :class:`NameRule`; ``str()`` is the one-line refusal."""

    def __init__(self, field_name: str, line: str, allowed: str, value: object) -> None:
        super().__init__(field_name, allowed, value)
        self.args = (line,)


def shown(value: object) -> str:
    """``value`` quoted on one line: control, non-ASCII and quote characters escaped."""
    if not isinstance(value, str):
        return repr(value)
    return "'" + value.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"


def refusal(field: str, value: object, allowed: str, source: str = "", entry: object = None) -> str:
    """The one refusal line; ``source`` (a file) and ``entry`` (its entry) say where ``value`` was read."""
    where = f" ({source} entry {shown(entry)})" if source else ""
    return f"{field}{where}: {shown(value)} is not a valid name: {allowed}"


@dataclass(frozen=True)
class NameRule:
    """A set of names: :data:`NAME`, or a narrower one built with :meth:`narrowed` (a board name
    also names a Unix user), which still refuses everything :data:`NAME` refuses."""

    pattern: str  # anchored, without lookaround
    max_len: int
    allowed: str  # what the refusal says is allowed
    base: NameRule | None = None

    def ok(self, value: object) -> bool:
        """Whether ``value`` is a name of this rule."""
        if self.base is not None and not self.base.ok(value):
            return False
        return (
            isinstance(value, str)
            and len(value) <= self.max_len
            and re.fullmatch(self.pattern, value) is not None
        )

    def path_ok(self, value: object) -> bool:
        """Whether ``value`` is a relative path of names of this rule joined by ``/``."""
        if not isinstance(value, str) or len(value) > PATH_MAX:
            return False
        return all(self.ok(part) for part in value.split("/"))

    def check(self, value: object, field: str, *, source: str = "", entry: object = None,
              error: Refuse | None = None) -> str:  # fmt: skip
        """``value`` when it is a name, else ``error(line)`` raised (default :class:`BadName`)."""
        if self.ok(value):
            return str(value)
        raise _refused(field, value, self.allowed, source, entry, error)

    def check_path(self, value: object, field: str, *, source: str = "", entry: object = None,
                   error: Refuse | None = None) -> str:  # fmt: skip
        """``value`` when it is a relative path of names, else ``error(line)`` raised."""
        if self.path_ok(value):
            return str(value)
        raise _refused(field, value, self.path_allowed, source, entry, error)

    @property
    def path_allowed(self) -> str:
        """What a refused path is told is allowed."""
        return f"a relative path of names joined by '/' (each {self.allowed}; at most {PATH_MAX} in all)"

    def narrowed(self, pattern: str, max_len: int, allowed: str) -> NameRule:
        """A rule accepting only the names of this one that also match ``pattern``."""
        return NameRule(pattern, max_len, allowed, base=self)


def _refused(field: str, value: object, allowed: str, source: str, entry: object,
             error: Refuse | None) -> Exception:  # fmt: skip
    line = refusal(field, value, allowed, source, entry)
    return error(line) if error is not None else BadName(field, line, allowed, value)


NAME = NameRule(NAME_PATTERN, NAME_MAX, NAME_ALLOWED)


def valid_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is a name (it becomes the folder ``ROOT/jobs/<job_id>``)."""
    return NAME.check(job_id, "job_id")


BOARD_PATH_ALLOWED = (
    "an absolute path of the board without '..' (a folder the board's application writes), "
    f"or {NAME.path_allowed} under the agent root"
)


def board_path_ok(value: object) -> bool:
    """Whether ``value`` names a folder to read on a board: absolute (the board's own, no '..' part,
    no NUL or newline) or relative to the agent root (a path of names)."""
    if not isinstance(value, str) or not value.startswith("/"):
        return NAME.path_ok(value)
    return not ({"\0", "\n"} & set(value)) and ".." not in value.split("/")


def check_board_path(value: object, field: str, *, error: Refuse | None = None) -> str:
    """``value`` when :func:`board_path_ok`, else ``error(line)`` raised (default :class:`BadName`)."""
    if board_path_ok(value):
        return str(value)
    raise _refused(field, value, BOARD_PATH_ALLOWED, "", None, error)
