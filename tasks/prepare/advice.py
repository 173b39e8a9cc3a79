"""Advice rehearsed before it is offered (issue 46): a stop whose line suggests a recipe override
(``trainable.strategy = 'classifier'``, ``trainable.batchnorm = 'batch-stats'``, ...) has that
override tried first: the preparation run again with it, in a scratch folder, up to the stage that
stopped (validation only when the stop was a validation check). The advice stays when the rehearsal
gets past that stop; when it ends in the same stop (or the recipe already has that value) the
override is taken out of the line, which says instead that it would not help, and keeps its other
options. A ``key = 'value'`` the recipe already holds (given or by default) that the line does not
offer as an option describes the recipe ("with trainable.batchnorm = 'frozen' the statistics ...",
"not supported by training.runtime = 'autograd'"): it is neither rehearsed nor taken out. A stop
whose cause lies outside what the override changes (a node after the classifier, a frozen front the
override does not touch) no longer sends the user round the same loop."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable

from tasks.errors import PipelineError
from tasks.recipe.load import apply_overrides, parse_recipe
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
ADVICE = re.compile(r"\b((?:trainable|training|loss|model)\.\w+) = '([^']+)'")
# an override that makes a choice alone: the keys it replaces ("trainable.strategy = 'classifier'"
# advises training the classifier, not the classifier beside the recipe's own names and patterns)
REPLACES = {"trainable.strategy": ("names", "patterns", "train_from")}


def overrides(message: str) -> list[tuple[str, str]]:
    """The ``key = 'value'`` overrides a stop's line suggests, in order, each once."""
    return list(dict.fromkeys(ADVICE.findall(message)))


def overridden(recipe: Recipe, key: str, value: str) -> Recipe:
    """``recipe`` with ``key = value``, and without the keys that choice replaces (:data:`REPLACES`)."""
    raw = apply_overrides(recipe.raw, {key: value})
    for leaf in REPLACES.get(key, ()):
        raw[key.partition(".")[0]].pop(leaf, None)
    return parse_recipe(raw, recipe.source)


def _same_values(a: Recipe, b: Recipe) -> bool:
    """``a`` and ``b`` hold the same values, whatever their files say (a default written out or not)."""
    return all(getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(a) if f.name != "raw")


def _same_stop(first: PipelineError, again: BaseException) -> bool:
    """``again`` is ``first``'s stop: same class, same check, same line once advice is taken out."""
    return (
        type(again) is type(first)
        and getattr(again, "check", None) == getattr(first, "check", None)
        and ADVICE.sub("", str(again)) == ADVICE.sub("", str(first))
    )


def _without(message: str, phrase: str) -> str:
    """``message`` with ``phrase`` taken out of the options it sits among (``(a, or P)``, ``P, or
    b``, ``(P)``, ``a, or try P``); as it was when it reads no such way (the note then says it)."""
    p = re.escape(phrase)
    for form in (rf" \({p}\)", rf"{p}(?: avoids it)?, or ", rf",? or (?:try )?{p}", rf"{p}; "):
        found = re.search(form, message)
        if found:
            return message[: found.start()] + message[found.end() :]
    return message


def rehearse(recipe: Recipe, stop: PipelineError, rerun: Callable[[Recipe], object]) -> None:
    """Rehearse each override ``stop``'s line suggests through ``rerun`` (a preparation of the
    overridden recipe up to the stage that stopped); one that ends in the same stop, or that the
    recipe already has, is taken out of the line and a note says so. ``stop`` keeps its class,
    check and report; only its line changes. A rehearsal that breaks otherwise leaves the advice."""
    text, notes = str(stop), []
    for key, value in overrides(text):
        phrase = f"{key} = '{value}'"
        try:
            changed = overridden(recipe, key, value)
        except PipelineError as exc:
            log.debug("%s does not make a valid recipe here: %s", phrase, exc)
            continue
        if _same_values(changed, recipe):  # the recipe's own value, given or by default
            shorter = _without(text, phrase)
            if shorter != text:  # offered as an option: one the recipe already takes
                notes.append(f"the recipe already has {phrase}")
                text = shorter
            continue  # else the line describes the recipe ("with X ...", "by X"): no advice to rehearse
        else:
            log.info("rehearsing the advice %s before it is offered", phrase)
            try:
                rerun(changed)
                continue  # the rehearsal prepared the recipe: the advice holds
            except PipelineError as again:
                if not _same_stop(stop, again):
                    log.debug("rehearsed %s: gets past this stop, then %s", phrase, again)
                    continue
            except Exception as exc:  # noqa: BLE001 - not known to fail the same way: the advice stays
                log.debug("rehearsing %s broke: %r", phrase, exc)
                continue
            notes.append(f"{phrase} would not help (rehearsed: it ends in this same stop)")
        text = _without(text, phrase)
    if notes:
        stop.args = (f"{text}; {'; '.join(notes)}",)
