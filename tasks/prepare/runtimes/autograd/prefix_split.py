"""Frozen-prefix caching for the autograd runtime: its step graphs cut where the frozen part ends.

The train step is a plain ONNX graph (feeds + trainable tensors + noise -> loss, outputs,
gradients), so the frozen prefix is found on it directly: the *cut* is the latest tensor computed
from the model's inputs alone (no trainable tensor, no noise) from which, with the labels, the
trainable tensors and the noise, every output of the step follows. ``artifacts/split/`` then holds
``prefix.onnx`` (the model's inputs -> the cut, the board's inference session fills its cache with
it), ``train_step.onnx`` and ``eval_step.onnx`` starting at the cut, and their ``step.json``. The
eval step's cut is its tensor equal to the train step's on the recipe's data; a prefix whose rows
depend on the other rows of the batch (BatchNorm on batch statistics) is not cached. The split
steps must give the full steps' loss, outputs and gradients, or preparation stops. The inference
template and checkpoint stay the full ones: the board writes the whole inference model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tasks.errors import ArtifactError
from tasks.prepare.manifest import file_entry
from tasks.prepare.onnx_versions import check_board_loadable
from tasks.prepare.prefix import SPLIT_DIR, batch_dim_symbolic, extract
from tasks.prepare.runtimes.autograd.steps import EVAL_FILE, TRAIN_FILE, model_inputs
from tasks.recipe.schema import Recipe

log = logging.getLogger(__name__)
SPLIT_FILES = {  # artifacts/split/, beside the ORT runtime's split files
    key: f"{SPLIT_DIR}/{name}"
    for key, name in (
        ("prefix_model", "prefix.onnx"),
        ("train_step", TRAIN_FILE),
        ("eval_step", EVAL_FILE),
        ("step", "step.json"),
    )  # fmt: skip
}
CUT = "frozen_prefix"  # the cut's name in the split files (no split when a step has a tensor of that name)
BATCH = 8  # rows of the recipe's data the checks run
RTOL = 1e-4  # of each result's largest |value| (onnx_step's tolerance): ORT fuses the halves apart
SPLIT_TOL = 1e-3  # the split steps against the full ones: validation's SPLIT_TOL, deep models' rounding


def _reached(model: onnx.ModelProto, sources: set[str], skip: frozenset[str] = frozenset()) -> set[str]:
    """Tensors computed from ``sources`` (not through the nodes writing ``skip``)."""
    have = set(sources)
    for node in model.graph.node:
        if node.output[0] not in skip and any(i in have for i in node.input):
            have.update(node.output)
    return have


def _computable(model: onnx.ModelProto, sources: set[str]) -> set[str]:
    have = set(sources) | {i.name for i in model.graph.initializer} | {""}
    for node in model.graph.node:
        if all(i in have for i in node.input):
            have.update(node.output)
    return have


def _batch_shapes(model: onnx.ModelProto, inputs: list[str]) -> list[onnx.NodeProto]:
    """``Shape(input, start=0, end=1)`` nodes: the batch size, which the cut tensor gives as well."""
    found = []
    for node in model.graph.node:
        attrs = {a.name: a.i for a in node.attribute}
        if (
            node.op_type == "Shape"
            and node.input[0] in inputs
            and attrs.get("start", 0) == 0
            and attrs.get("end") == 1
        ):
            found.append(node)
    return found


def cuts(
    model: onnx.ModelProto, inputs: list[str], others: set[str], first: str | None = None
) -> Iterator[str]:
    """The tensors computed from ``inputs`` alone from which (with ``others``: labels, trainable
    tensors, noise) every output follows, latest first (``first`` before the others, when it is one:
    the eval step's tensor of the train step's cut's name)."""
    shapes = frozenset(o for n in _batch_shapes(model, inputs) for o in n.output)
    derived = _reached(model, set(inputs), shapes) - set(inputs)
    tainted = _reached(model, others)
    outputs = [o.name for o in model.graph.output]
    names = [name for node in reversed(model.graph.node) for name in node.output]
    for name in ([first] if first in derived else []) + [n for n in names if n != first]:
        if name in derived and name not in tainted:
            have = _computable(model, others | shapes | {name})
            if all(o in have for o in outputs):
                yield name


def renamed(model: onnx.ModelProto, old: str, inputs: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose tensor ``old`` is :data:`CUT`; the batch size read from ``inputs``
    is read from it too (``inputs`` empty: not)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    shapes = {n.output[0] for n in _batch_shapes(copy, inputs)}
    for node in copy.graph.node:
        node.input[:] = [
            CUT if i == old or (node.output[0] in shapes and i in inputs) else i for i in node.input
        ]
        node.output[:] = [CUT if o == old else o for o in node.output]
    for value in [*copy.graph.value_info, *copy.graph.output]:
        value.name = CUT if value.name == old else value.name
    return copy


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from tasks.quiet import ort_session  # the plain inference build, as the board's; errors only logged

    sess = ort_session(model.SerializeToString())
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {i.name: feeds[i.name] for i in sess.get_inputs()}), strict=True))


def _close(got: np.ndarray, want: np.ndarray, rtol: float = RTOL) -> bool:
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    return got.shape == want.shape and bool(
        np.abs(got.astype(np.float64) - want).max(initial=0.0) <= rtol * scale
    )


def _feeds(
    recipe: Recipe, spec: dict[str, Any], params: dict[str, np.ndarray]
) -> dict[str, dict[str, np.ndarray]]:
    """Example feeds of each step: the recipe's data (labels at random), the weights, uniform noise."""
    rng = np.random.default_rng(0)
    data = {n: t.numpy() for n, t in zip(recipe.model.input_names, model_inputs(recipe, BATCH), strict=True)}
    for feed in spec["feeds"]:
        if feed["name"] not in data:
            shape = [BATCH if d == "batch" else d for d in feed["shape"]]
            data[feed["name"]] = rng.integers(0, 2, shape).astype(feed["dtype"])
    noise = {key: {n["name"]: rng.random([BATCH if d == "batch" else d for d in n["shape"]], dtype=np.float32)
                   for n in spec[key]} for key in ("noise", "eval_noise")}  # fmt: skip
    return {"train": {**data, **params, **noise["noise"]}, "eval": {**data, **params, **noise["eval_noise"]}}


def split_steps(recipe: Recipe, out_dir: Path, spec: dict[str, Any], files: dict[str, Any],
                params: dict[str, np.ndarray]) -> dict[str, Any]:  # fmt: skip
    """Write ``artifacts/split/`` for the prepared steps; the manifest's ``prefix_cache`` entry
    (``enabled`` False with the reason when the steps do not split)."""
    if recipe.training.prefix_cache == "off":
        return {"enabled": False, "reason": "training.prefix_cache = 'off'"}
    art, inputs = Path(out_dir) / "artifacts", list(recipe.model.input_names)
    steps = {"train": onnx.load(str(art / TRAIN_FILE)), "eval": onnx.load(str(art / EVAL_FILE))}
    labels = [f["name"] for f in spec["feeds"] if f["name"] not in inputs]
    others = {"train": [*labels, *params, *(n["name"] for n in spec["noise"])]}
    others["eval"] = [*labels, *params, *(n["name"] for n in spec["eval_noise"])]
    names = {t for m in steps.values() for n in m.graph.node for t in [*n.input, *n.output]}
    if CUT in names | {i.name for m in steps.values() for i in [*m.graph.input, *m.graph.initializer]}:
        return _off(recipe, f"the step graphs already have a tensor named {CUT!r}")
    found = next(cuts(steps["train"], inputs, set(others["train"])), None)
    if found is None:
        return _off(recipe, "no single tensor of the frozen part feeds the trainable part and the loss")
    feeds = _feeds(recipe, spec, params)
    prefix = extract(steps["train"], inputs, [found])
    cut = _run(prefix, feeds["train"])[found]
    if len(cut) != BATCH or cut.dtype != np.float32:
        return _off(
            recipe, f"the cut tensor {found} is {cut.dtype}{list(cut.shape)}, not float32 rows of the batch"
        )
    alone = _run(prefix, {n: a[:1] for n, a in feeds["train"].items() if n in inputs})[found]
    if not _close(alone, cut[:1]):
        return _off(
            recipe,
            f"the frozen part up to {found} mixes the rows of a batch (BatchNorm on batch statistics?)",
        )
    match = next((c for c in cuts(steps["eval"], inputs, set(others["eval"]), first=found)
                  if _close(_run(extract(steps["eval"], inputs, [c]), feeds["eval"])[c], cut)), None)  # fmt: skip
    if match is None:
        return _off(recipe, f"the eval step computes no tensor equal to the train step's cut {found}")
    split = {"train": _suffix(steps["train"], found, inputs, others["train"]),
             "eval": _suffix(steps["eval"], match, inputs, others["eval"])}  # fmt: skip
    _check(steps, split, feeds, cut)
    return _write(
        recipe, out_dir, spec, files, renamed(prefix, found, []), split, cut, len(prefix.graph.node)
    )


def _suffix(model: onnx.ModelProto, cut: str, inputs: list[str], others: list[str]) -> onnx.ModelProto:
    at_cut = renamed(model, cut, inputs)
    have = {i.name for i in model.graph.input}
    suffix = extract(at_cut, [CUT, *(n for n in others if n in have)], [o.name for o in model.graph.output])
    batch_dim_symbolic(suffix.graph.input[0])
    return suffix


def _check(steps: dict[str, Any], split: dict[str, Any], feeds: dict[str, Any], cut: np.ndarray) -> None:
    """ArtifactError unless each split step gives its full step's results from the prefix's rows."""
    for key in ("train", "eval"):
        want, got = _run(steps[key], feeds[key]), _run(split[key], {**feeds[key], CUT: cut})
        for name, value in want.items():
            if not _close(got[name], value, SPLIT_TOL):
                raise ArtifactError(
                    f"the frozen-prefix split of the {key} step computes {name} unlike the full step; "
                    "set training.prefix_cache = 'off'"
                )


def _off(recipe: Recipe, reason: str) -> dict[str, Any]:
    log.info("frozen-prefix caching off for %s: %s", recipe.name, reason)
    return {"enabled": False, "reason": reason}


def _write(recipe: Recipe, out_dir: Path, spec: dict[str, Any], files: dict[str, Any], prefix: onnx.ModelProto,
           split: dict[str, Any], cut: np.ndarray, prefix_nodes: int) -> dict[str, Any]:  # fmt: skip
    out_dir = Path(out_dir)
    (out_dir / SPLIT_DIR).mkdir(parents=True, exist_ok=True)
    onnx.save(prefix, str(out_dir / SPLIT_FILES["prefix_model"]))
    for key in ("train", "eval"):
        check_board_loadable(split[key], f"split {key} step")
        onnx.save(split[key], str(out_dir / SPLIT_FILES[f"{key}_step"]))
    shape = ["batch", *cut.shape[1:]]
    have = {i.name for i in split["train"].graph.input}
    feeds = [
        {"name": CUT, "dtype": "float32", "shape": shape},
        *(f for f in spec["feeds"] if f["name"] in have),
    ]
    (out_dir / SPLIT_FILES["step"]).write_text(json.dumps({**spec, "feeds": feeds}, indent=2))
    entries = {k: file_entry(out_dir / rel, rel) for k, rel in SPLIT_FILES.items()}
    entries |= {k: files[k] for k in ("checkpoint", "inference_template")}  # the whole model's
    log.info("frozen-prefix caching for %s: cut at %s (%d prefix nodes, %d suffix nodes of the train step)",
             recipe.name, shape, prefix_nodes, len(split["train"].graph.node))  # fmt: skip
    return {
        "enabled": True,
        "reason": "",
        "cut": CUT,
        "feature_shape": shape,
        "prefix_inputs": [i.name for i in prefix.graph.input],
        "passthrough": [f["name"] for f in feeds[1:]],
        "prefix_nodes": prefix_nodes,
        "suffix_nodes": len(split["train"].graph.node),
        "prefix_params": sum(int(np.prod(i.dims)) for i in prefix.graph.initializer),
        "suffix_frozen": [],
        "dtype": recipe.training.cache_dtype,
        "store": recipe.training.cache_store,
        "files": entries,
    }
