"""Every ``odl`` command and flag, read from the argparse parser (``flows/cli/parser.py``)."""

from __future__ import annotations

import argparse

from docs.gen.markdown import cell, code, table
from flows.cli.parser import build_parser


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand of ``parser``, in declaration order."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), p) for name, p in action.choices.items()]
    return out


def _flag(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs == 0:
            return code(names)
        metavar = action.metavar or (
            action.dest.upper() if not action.choices else "{" + ",".join(map(str, action.choices)) + "}"
        )
        return code(f"{names} {metavar}")
    name = action.metavar or action.dest
    return code(name.upper() if action.nargs != "?" else f"[{name.upper()}]")


def _details(action: argparse.Action) -> str:
    parts = []
    if action.required and action.option_strings:
        parts.append("required")
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        parts.append("one of " + ", ".join(code(c) for c in action.choices))
    if action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0:
        parts.append("default " + code(action.default))
    if isinstance(action, argparse._AppendAction):
        parts.append("repeatable")
    return "; ".join(parts)


def _command(path: str, help_text: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    actions = [
        a
        for a in parser._actions
        if a.help != argparse.SUPPRESS
        and not isinstance(a, argparse._HelpAction)
        and not isinstance(a, argparse._SubParsersAction)
    ]
    out = ["", f"{'#' * depth} `{path}`", ""]
    description = parser.description or help_text
    if description:
        out += ["```text", description.strip(), "```", ""] if "\n" in description else [cell(description), ""]
    if actions:
        rows = [[_flag(a), _details(a), cell(a.help or "")] for a in actions]
        out.append(table(["argument", "details", "help"], rows))
    for name, sub_help, sub in _subcommands(parser):
        out += _command(f"{path} {name}", sub_help, sub, min(depth + 1, 4))
    return out


def cli_page() -> str:
    """The page: every command, its description and a table of its arguments."""
    parser = build_parser()
    commands = _subcommands(parser)
    out = [
        "# Command line",
        "",
        "Every `odl` command, flag and default, read from the parser (`flows/cli/parser.py`). "
        "`-v`/`--verbose` is accepted anywhere on the line: debug lines, library messages and the "
        "traceback. `odl COMMAND --help` prints the same text. The exit statuses are in "
        "[Exit codes](exit-codes.md).",
        "",
        "| command | what it does |",
        "|---|---|",
        *[f"| [`odl {name}`](#odl-{name}) | {cell(help_text)} |" for name, help_text, _ in commands],
    ]
    for name, help_text, sub in commands:
        out += _command(f"odl {name}", help_text, sub, 2)
    return "\n".join(out)
