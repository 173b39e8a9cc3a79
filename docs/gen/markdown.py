"""Markdown helpers shared by the reference pages: table cells that survive any text."""

from __future__ import annotations

import html


def cell(text: object) -> str:
    """Text for a table cell: one line, pipes escaped, angle brackets as entities."""
    one_line = " ".join(str(text).split())
    return html.escape(one_line, quote=False).replace("|", "\\|")


def code(text: object) -> str:
    """An inline code span for a table cell (Python-Markdown's tables split no row inside a code span)."""
    value = str(text)
    fence = "``" if "`" in value else "`"
    return f"{fence}{value}{fence}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table from already escaped cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
