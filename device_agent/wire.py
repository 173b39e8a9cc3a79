"""What every wire type is built from: the protocol version, :class:`SpecError`, the field checks
and :class:`BlobRef` (a file named by its sha256, which ``job.json`` and its ``prefix`` refer to).

The lowest module of the protocol: it imports nothing of the project, and the wire types
(:mod:`device_agent.jobspec`, :mod:`device_agent.messages`, :mod:`device_agent.prefix_spec`)
import it. Import these names from :mod:`device_agent.protocol`, which re-exports them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

PROTOCOL_VERSION = 2
VERSION_KEY = "protocol_version"  # the one spelling of the version on the wire
V1_VERSION_KEYS = ("protocol", "v")  # protocol 1's spellings: read only to report the mismatch

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class SpecError(ValueError):
    """A wire object is malformed; ``field`` names the offending field."""

    def __init__(self, field_name: str, expected: str, got: object = None) -> None:
        self.field = field_name
        self.expected = expected
        got_txt = "" if got is None else f" (got {got!r})"
        super().__init__(f"field '{field_name}': expected {expected}{got_txt}")


def valid_blob_name(sha256: object, field_name: str = "sha256") -> str:
    """Return ``sha256`` if it names a blob: 64 lowercase hex digits (so never a path)."""
    if not isinstance(sha256, str) or not SHA256_RE.match(sha256):
        raise SpecError(field_name, "64 lowercase hex digits", sha256)
    return sha256


def parse_json(text: str, field_name: str, expected: str) -> Any:
    """``json.loads(text)``, or a SpecError naming ``field_name`` with the decoder's complaint."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(field_name, f"{expected} ({exc.msg} at line {exc.lineno})") from exc


def get_field(
    d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str, default: Any = ...
) -> Any:
    """``d[key]`` checked against ``typ`` (bool is never an int here); ``default`` when absent."""
    name = f"{where}.{key}" if where else key
    if key not in d:
        if default is ...:
            raise SpecError(name, f"a value of type {_tname(typ)}", None)
        return default
    val = d[key]
    if val is None and default is None:
        return None
    if isinstance(val, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise SpecError(name, _tname(typ), val)
    if not isinstance(val, typ):
        raise SpecError(name, _tname(typ), val)
    return val


def _tname(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def reject_unknown(d: dict[str, Any], allowed: set[str], where: str) -> None:
    """SpecError naming the first key of ``d`` outside ``allowed`` (for what the host sends)."""
    extra = sorted(set(d) - allowed)
    if extra:
        raise SpecError(f"{where}.{extra[0]}" if where else extra[0], "no such field (unknown key)")


def typed_fields(cls: Any, d: dict[str, Any], where: str) -> dict[str, Any]:
    """The values of dataclass ``cls``'s int/float/bool/str fields read and type-checked from ``d``."""
    types: dict[str, Any] = {
        "int": int,
        "float": (int, float),
        "bool": bool,
        "str": str,
        "float | None": (int, float),
    }  # None only where the default is None
    vals: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else ...
        vals[f.name] = get_field(d, f.name, types[str(f.type)], where, default)
    return vals


def read_version(d: dict[str, Any], where: str, default: int | None = None) -> int:
    """The protocol version ``d`` was written for (``default`` when it names none).

    Protocol 1's keys are read too, so a file of that release fails as a version mismatch
    rather than as a malformed object.
    """
    name = f"{where}.{VERSION_KEY}" if where else VERSION_KEY
    for key in (VERSION_KEY, *V1_VERSION_KEYS):
        if key in d:
            val = d[key]
            if isinstance(val, bool) or not isinstance(val, int):
                raise SpecError(name, "an integer protocol version", val)
            return val
    if default is None:
        raise SpecError(name, "an integer protocol version")
    return default


def check_version(d: dict[str, Any], where: str) -> int:
    """``d``'s protocol version, or SpecError naming ``protocol_version`` when it is not ours."""
    version = read_version(d, where)
    if version != PROTOCOL_VERSION:
        name = f"{where}.{VERSION_KEY}" if where else VERSION_KEY
        raise SpecError(name, f"protocol version {PROTOCOL_VERSION}", version)
    return version


@dataclass(frozen=True)
class BlobRef:
    """A file held under ``blobs/<sha256>`` on the board."""

    sha256: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size}

    @classmethod
    def from_dict(cls, d: object, where: str) -> BlobRef:
        if not isinstance(d, dict):
            raise SpecError(where, "an object with sha256 and size", d)
        reject_unknown(d, {"sha256", "size"}, where)
        sha = valid_blob_name(get_field(d, "sha256", str, where), f"{where}.sha256")
        size = get_field(d, "size", int, where)
        if size < 0:
            raise SpecError(f"{where}.size", "a size >= 0", size)
        return cls(sha, size)
