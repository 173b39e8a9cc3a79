"""Advice rehearsed before it is offered (issue 46): a stop whose line suggests a recipe override
(``trainable.strategy = 'classifier'``, ``trainable.batchnorm = 'batch-stats'``, ...) has that
override tried first: the preparation run again with it, in a scratch folder, up to the stage that
stopped (validation only when the stop was a validation check). The advice stays when the rehearsal
gets past that stop; when it ends in the same stop (or the recipe already has that value) the
override is taken out of the line, which says instead that it would not help, and keeps its other
options. A stop whose cause lies outside what the override changes (a node after the classifier, a
frozen front the override does not touch) no longer sends the user round the same loop."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from tasks.errors import PipelineError
from tasks.recipe.load import apply_overrides, parse_recipe
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
ADVICE = re.compile(r"\b((?:trainable|training|loss|model)\.\w+) = '([^']+)'")


def overrides(message: str) -> list[tuple[str, str]]:
    """The ``key = 'value'`` overrides a stop's line suggests, in order, each once."""
    return list(dict.fromkeys(ADVICE.findall(message)))


def _current(recipe: Recipe, key: str) -> object:
    node: object = recipe.raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _same_stop(first: PipelineError, again: BaseException) -> bool:
    """``again`` is ``first``'s stop: same class, same check, same line once advice is taken out."""
    return (
        type(again) is type(first)
        and getattr(again, "check", None) == getattr(first, "check", None)
        and ADVICE.sub("", str(again)) == ADVICE.sub("", str(first))
    )


def _without(message: str, phrase: str) -> str:
    """``message`` with ``phrase`` taken out of the list of options it sits in."""
    for form in (f", or {phrase}", f"{phrase}, or ", f" ({phrase})", f" or {phrase}", f"{phrase}; "):
        if form in message:
            return message.replace(form, "", 1)
    return message


def rehearsed(recipe: Recipe, stop: PipelineError, rerun: Callable[[Recipe], object]) -> PipelineError:
    """``stop`` with each override its line suggests rehearsed through ``rerun`` (a preparation of
    the overridden recipe up to the stage that stopped): an override that ends in the same stop is
    replaced by a note saying so. The same exception (class, check, report), its line rewritten."""
    text, notes = str(stop), []
    for key, value in overrides(text):
        phrase = f"{key} = '{value}'"
        if _current(recipe, key) == value:
            notes.append(f"the recipe already has {phrase}")
        else:
            try:
                rerun(parse_recipe(apply_overrides(recipe.raw, {key: value}), recipe.source))
                continue  # the rehearsal prepared the recipe: the advice holds
            except PipelineError as again:
                if not _same_stop(stop, again):
                    log.debug("rehearsed %s: gets past this stop, then %s", phrase, again)
                    continue
            notes.append(f"{phrase} would not help (rehearsed: it ends in this same stop)")
        text = _without(text, phrase)
    if notes:
        stop.args = (f"{text}; {'; '.join(notes)}",)
    return stop
