"""The ``[data]`` table: host files, a file on the board, or a board dataset folder that grows."""

from __future__ import annotations

import re
from pathlib import Path

from tasks.recipe.schema import DataSpec
from tasks.recipe.table import Table, optional_ref

DATA_KEYS = {"make", "train", "board_train", "board_dataset", "board_format", "board_select", "replay",
             "eval", "test", "extra_tests", "feeds"}  # fmt: skip
BOARD_FORMATS = ("npz-shards", "image-folder")
VERSION_RE = re.compile(r"^v\d{4,}$")


def parse_data(t: Table, base: Path) -> DataSpec:
    extra = Table(
        t.get("extra_tests", dict, {}), "data.extra_tests", set(t.d.get("extra_tests", {})), t.source
    )
    feeds = t.get("feeds", dict, {})
    if not all(isinstance(v, str) for v in feeds.values()):
        raise t.err("feeds", "a table of model input name = npz key (strings)", feeds)
    spec = DataSpec(
        test=t.path("test", base, required=True),  # type: ignore[arg-type]
        train=t.path("train", base),
        board_train=t.get("board_train", str, None),
        eval=t.path("eval", base),
        extra_tests={k: extra.path(k, base) for k in extra.d},  # type: ignore[misc]
        make=optional_ref(t, "make"),
        feeds=dict(feeds),
        **_board_dataset(t),
    )
    sources = [k for k in ("train", "board_train", "board_dataset") if getattr(spec, k) is not None]
    if len(sources) != 1:
        raise t.err(
            "train",
            "exactly one of data.train (host file), data.board_train (a file on the board) or "
            f"data.board_dataset (a folder on the board that grows) (got {sources or 'none'})",
        )
    for key in ("board_train", "board_dataset"):
        bt = getattr(spec, key)
        if bt is not None and (not bt.strip() or "\0" in bt or ".." in bt.split("/")):
            raise t.err(key, "an absolute path, or one relative to the agent root without '..'", bt)
    return spec


def _board_dataset(t: Table) -> dict:
    """The board dataset folder's fields (format, selection, replay share)."""
    fmt = t.get("board_format", str, "npz-shards")
    if fmt not in BOARD_FORMATS:
        raise t.err("board_format", " or ".join(repr(f) for f in BOARD_FORMATS), fmt)
    select = t.get("board_select", str, "all")
    if select not in ("all", "new+replay") and not VERSION_RE.match(select):
        raise t.err("board_select", "'all', 'new+replay' or a registry version such as 'v0003'", select)
    replay = t.number("replay", 0.0, 0.0, 0.95)
    folder = t.get("board_dataset", str, None)
    if folder is None:
        extra = sorted(k for k in ("board_format", "board_select", "replay") if k in t.d)
        if extra:
            raise t.err(extra[0], "data.board_dataset too (it applies to a board dataset folder)")
    elif replay > 0 and select != "new+replay":
        raise t.err("replay", '0 unless data.board_select = "new+replay"', replay)
    return {"board_dataset": folder, "board_format": fmt, "board_select": select, "replay": replay}
