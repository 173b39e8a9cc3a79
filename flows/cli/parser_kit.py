"""What every part of ``odl``'s argument parser uses: the sub-parsers' type and :func:`command`."""

from __future__ import annotations

import argparse

Sub = argparse._SubParsersAction


def command(sub: Sub, name: str, area: str, handler: str, **kw: object) -> argparse.ArgumentParser:
    """A subcommand run by ``flows.cli.<area>.<handler>(args)``."""
    p = sub.add_parser(name, **kw)
    p.set_defaults(area=area, handler=handler)
    return p
