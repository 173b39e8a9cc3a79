"""What ``odl --help`` and its commands' help say (issue 46): every line of the command list is a
finished phrase, ``odl run`` says what it does not do and shows an example, ``odl stack`` explains
each of its actions, and ``odl board down`` (the last line of ``make down``) is a sentence, not JSON."""

from __future__ import annotations

import argparse
import re

from flows.cli.board import down_line
from flows.cli.parser import build_parser


def _sub(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def test_every_command_help_is_a_finished_phrase() -> None:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for choice in action._choices_actions:
        text = choice.help or ""
        assert text and not re.search(r"(\b(and|or|the|a|of)|'s)$", text), (choice.dest, text)


def test_run_help_describes_it_says_what_it_does_not_do_and_shows_an_example() -> None:
    text = " ".join(_sub("run").format_help().split())
    assert "neither evaluates nor promotes" in text
    assert "example: odl run recipes/digits.toml --board vboard" in text


def test_stack_help_explains_every_action() -> None:
    stack = _sub("stack")
    text = stack.format_help()
    choices = next(a for a in stack._actions if a.dest == "action").choices
    for action in choices:
        assert re.search(rf"^  {action}\s+\S", text, re.M), (action, text)


def test_board_down_prints_a_sentence() -> None:
    assert down_line({"name": "vboard", "stopped_sshd": True, "purged": False}) == (
        "board vboard stopped; its user, data and inventory entry are kept (--purge removes them)"
    )
    assert "was not running" in down_line({"name": "b", "stopped_sshd": False, "purged": False})
    assert down_line({"name": "b", "stopped_sshd": True, "purged": True}).startswith("board b removed")
