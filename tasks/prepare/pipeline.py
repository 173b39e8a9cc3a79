"""The one prepare path: data -> export -> training artifacts -> offline validation, in one folder.

:func:`prepare` is how every caller gets a :class:`~tasks.prepare.Prepared`: ``odl prepare`` and the
benches build every step into the folder they name (``cache=False``); ``odl run`` and the flow
(through :mod:`tasks.stages`) reuse the folder of the job's inputs (``cache=True``).

What a job is built from is hashed once, here (:func:`inputs`): the recipe (canonical, overrides
applied, without its ``[promotion]`` table, which judges a result but builds nothing), every host
file it names (data sets, weights, an ONNX model), the source of a ``module:callable`` model and
the pipeline's own preparation code. The hash names the prepared folder
``$ODL_HOME/prepared/<recipe>-<hash12>`` and the job on the board, so ``odl run`` and the flow reuse
the same folder and editing a model module re-exports under both.

Each step of a cached folder (export, artifacts, validation) leaves a ``.done-<step>`` marker
holding the input hash; a step whose marker matches is skipped, so a folder is never half reused.
With a shared store a step not done here is first looked for there (another host's folder of the
same inputs, fetched whole), and each step done here is published (:mod:`tasks.prepare.shared`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tasks.errors import PipelineError, ValidationFailed
from tasks.hashing import file_sha256
from tasks.paths import odl_home
from tasks.prepare import Prepared, advice
from tasks.prepare.datasets import ensure_datasets
from tasks.prepare.export.torch_model import one_build
from tasks.prepare.runtimes import export_model, generate
from tasks.prepare.shared import prepared_store
from tasks.prepare.staging import hold, remove_tree, staged
from tasks.prepare.validation.data_checks import check_data_against_model
from tasks.prepare.validation.validate import validate as run_validation
from tasks.quiet import warnings_at_debug
from tasks.recipe.datafiles import check_data_files, recipe_files
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)

STEPS = ("export", "artifacts", "validate")
T = TypeVar("T")


@dataclass(frozen=True)
class Inputs:
    """A recipe and the sha256 of everything a job is built from (``hashes``: field -> sha256)."""

    recipe: Recipe
    hashes: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """sha256 over ``hashes``: equal keys build and train the same job."""
        return hashlib.sha256(json.dumps(self.hashes, sort_keys=True).encode()).hexdigest()

    @property
    def folder(self) -> Path:
        """The prepared folder of these inputs: ``$ODL_HOME/prepared/<recipe>-<key12>`` (not created
        here: a build creates it, and removes it again when it fails)."""
        return odl_home() / "prepared" / f"{self.recipe.name}-{self.key[:12]}"


def _quiet(step: Callable[..., T]) -> Callable[..., T]:
    """A step whose Python warnings (torch's ``size_average`` deprecation at a model's construction,
    a model's own) are DEBUG records of this module's logger, as in :func:`prepare`: the flow runs
    each step as its own task, and the warnings came out on the terminal mid-run."""

    @functools.wraps(step)
    def quiet(*args: Any, **kwargs: Any) -> T:
        with warnings_at_debug(log):
            return step(*args, **kwargs)

    return quiet


def recipe_build_hash(recipe: Recipe) -> str:
    """sha256 of the canonical recipe without what builds nothing: ``[promotion]`` (it judges),
    ``[fleet]`` (it schedules rounds) and ``training.start_from`` (the warm checkpoint is made per
    run, from the registry)."""
    raw = {k: v for k, v in recipe.raw.items() if k not in ("promotion", "fleet")}
    if isinstance(raw.get("training"), dict) and "start_from" in raw["training"]:
        raw["training"] = {k: v for k, v in raw["training"].items() if k != "start_from"}
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


def prepare_code_hash() -> str:
    """sha256 of the preparation code (``tasks/prepare/``): a pipeline upgrade rebuilds the folder."""
    digest = hashlib.sha256()
    folder = Path(__file__).parent
    for path in sorted(folder.rglob("*.py")):  # the runtimes' folders too
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def inputs(recipe: Recipe) -> Inputs:
    """Hash the recipe, the host files it names and a callable model's module source."""
    files: dict[str, Path] = dict(recipe_files(recipe))
    if recipe.model.kind == "callable":
        module = recipe.model.ref.split(":", 1)[0].replace(".", "/") + ".py"
        files["model.callable"] = recipe.base_dir / module
    elif recipe.model.kind == "onnx":
        files["model.onnx"] = Path(recipe.model.ref)
    hashes = {"recipe": recipe_build_hash(recipe), "code.prepare": prepare_code_hash()}
    hashes |= {k: file_sha256(p) for k, p in sorted(files.items()) if Path(p).is_file()}
    return Inputs(recipe, hashes)


def step_done(inp: Inputs, step: str) -> bool:
    """True when ``step`` (export, artifacts, validate) of these inputs is complete on disk."""
    marker = inp.folder / f".done-{step}"
    return marker.is_file() and marker.read_text().strip() == inp.key


def _ready(inp: Inputs, step: str) -> bool:
    """``step`` done here, or in the folder of these inputs another host shared (fetched whole)."""
    return step_done(inp, step) or (
        prepared_store().fetch(inp.folder, inp.key, step) and step_done(inp, step)
    )


def _mark(folder: Path, step: str, inp: Inputs) -> None:
    (folder / f".done-{step}").write_text(inp.key + "\n")
    prepared_store().publish(folder, inp.key)  # shared with the other hosts (with a store)


@_quiet
def export(inp: Inputs) -> Path:
    """Export the recipe's model to ``<folder>/model.onnx`` (training mode); reused when done."""
    folder, path = inp.folder, inp.folder / "model.onnx"
    if _ready(inp, "export") and path.is_file():
        return path
    for step in STEPS:  # what was built from an older export is stale
        (folder / f".done-{step}").unlink(missing_ok=True)
    export_model(inp.recipe, folder)
    _mark(folder, "export", inp)
    return path


@_quiet
def generate_artifacts(inp: Inputs) -> dict[str, Any]:
    """The runtime's training artifacts and ``manifest.json`` from the exported model; reused when done."""
    model = export(inp)
    folder = inp.folder
    manifest = folder / "manifest.json"
    if _ready(inp, "artifacts") and manifest.is_file():
        return json.loads(manifest.read_text())
    (folder / ".done-validate").unlink(missing_ok=True)
    result = checked_generate(inp.recipe, model, folder)
    _mark(folder, "artifacts", inp)
    return result


def checked_generate(recipe: Recipe, model_onnx: Path, out_dir: Path) -> dict[str, Any]:
    """The data checked against the exported model (labels in the class range its graph gives, NaN,
    dtypes, shapes, token ids: DataError, exit 55), then the runtime's artifacts: no step is built
    or run on data the board would refuse, under any runtime, so a runtime never takes the blame."""
    check_data_against_model(recipe, Path(model_onnx))
    return generate(recipe, model_onnx, out_dir)


@_quiet
def validate(inp: Inputs, rehearse: Rehearsal | None = None) -> dict[str, Any]:
    """The host dry-run of the recipe on the generated artifacts (and the judging rehearsal when
    given); reused when done."""
    generate_artifacts(inp)
    folder = inp.folder
    report = folder / "validation.json"
    if _ready(inp, "validate") and report.is_file():
        return json.loads(report.read_text())
    result = _validated(inp.recipe, folder, rehearse)
    _mark(folder, "validate", inp)
    return result


def prepared(inp: Inputs) -> Prepared:
    """The :class:`~tasks.prepare.Prepared` view of the inputs' folder (validation None if skipped)."""
    folder = inp.folder
    validation = folder / "validation.json"
    has_validation = step_done(inp, "validate") and validation.is_file()
    return Prepared.of(
        folder,
        json.loads((folder / "manifest.json").read_text()),
        json.loads(validation.read_text()) if has_validation else None,
    )


Rehearsal = Callable[[Recipe, Prepared], dict[str, Any]]


def prepare(
    recipe: Recipe | Inputs,
    out_dir: Path | None = None,
    *,
    validate: bool = True,
    cache: bool = False,
    rehearse: Rehearsal | None = None,
    advise: bool = True,
) -> Prepared:
    """Generate the data if missing, check it, export, generate artifacts and (by default) validate
    offline; ``rehearse`` (the judging rehearsal of :mod:`tasks.stages.rehearse`) then runs on the
    validated folder and its figures join validation.json.

    ``cache=False`` builds every step in a temporary sibling of ``out_dir`` and renames it into
    place only when everything passed: a failed prepare leaves nothing, and an earlier prepared
    ``out_dir`` stays as it was. ``cache=True`` works in the folder of the recipe's :class:`Inputs`
    (``$ODL_HOME/prepared/<recipe>-<hash12>``) and skips each step already done for the same inputs
    (``odl run``, the flow); ``recipe`` may be those inputs, already hashed. Raises the stage's
    PipelineError subclass (RecipeError, DataError, ModelError, ArtifactError, ValidationFailed) on
    the first problem; an override its line suggests is rehearsed first (``advise``,
    :mod:`tasks.prepare.advice`).
    """
    if cache and out_dir is not None:
        raise ValueError("prepare(cache=True) works in the folder of the recipe's inputs: pass no out_dir")
    inp = recipe if isinstance(recipe, Inputs) else None
    spec = recipe.recipe if isinstance(recipe, Inputs) else recipe
    with warnings_at_debug(log):  # torch's and the model's warnings: in the log, not on the terminal
        ensure_datasets(spec)
        check_data_files(spec)  # what the board would refuse, before anything is exported
        try:
            with one_build():  # the PyTorch model's weights and statistics loaded once in this preparation
                if cache:
                    return _cached(inp or inputs(spec), validated=validate, rehearse=rehearse)
                return _prepared(spec, inp, out_dir, validate, rehearse)
        except PipelineError as stop:
            if advise and advice.overrides(str(stop)):
                advice.rehearse(spec, stop, _rehearsal(isinstance(stop, ValidationFailed)))
            raise


def _rehearsal(validated: bool) -> Callable[[Recipe], object]:
    """A preparation of an overridden recipe in a scratch folder (removed), up to the stage that
    stopped: validation only when the stop was a validation check; its own advice not rehearsed."""

    def run(recipe: Recipe) -> object:
        with tempfile.TemporaryDirectory(prefix="odl-rehearsal-") as scratch:
            return prepare(recipe, Path(scratch) / "prepared", validate=validated, advise=False)

    return run


def _prepared(spec: Recipe, inp: Inputs | None, out_dir: Path | None, validate: bool,
              rehearse: Rehearsal | None) -> Prepared:  # fmt: skip
    """:func:`prepare` into ``out_dir`` (or the inputs' folder), built in a staging sibling."""
    folder = Path(out_dir).resolve() if out_dir is not None else (inp or inputs(spec)).folder
    with staged(folder) as work:
        model_onnx = export_model(spec, work)
        hold("exported")  # tests only: a known point mid-build, see staging.hold
        manifest = checked_generate(spec, model_onnx, work)
        report = _validated(spec, work, rehearse) if validate else None
    return Prepared.of(folder, manifest, report)


def _validated(recipe: Recipe, folder: Path, rehearse: Rehearsal | None) -> dict[str, Any]:
    """Validation's report, with the judging rehearsal's figures when there is one."""
    report = run_validation(recipe, folder)
    if rehearse is not None:
        manifest = json.loads((folder / "manifest.json").read_text())
        report["checks"]["judging_rehearsed"] = rehearse(recipe, Prepared.of(folder, manifest, report))
        (folder / "validation.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    return report


def _cached(inp: Inputs, *, validated: bool, rehearse: Rehearsal | None = None) -> Prepared:
    """The steps of ``inp``'s folder not done yet for these inputs (validation only if ``validated``);
    a folder this call created is removed again when a step fails."""
    created = not inp.folder.exists()
    inp.folder.mkdir(parents=True, exist_ok=True)
    try:
        if validated:
            validate(inp, rehearse)
        else:
            generate_artifacts(inp)
    except BaseException:
        if created:
            remove_tree(inp.folder)
        raise
    return prepared(inp)
