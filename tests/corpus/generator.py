"""A property-based generator of small classifiers (Hypothesis: images here, sequence, audio and
token models in tests/corpus/families.py) and the classification of what
``prepare`` does with each: ``pass``, ``specific`` (stopped with one line that names the cause) or
``raw`` (ONNX Runtime's or Python's own text, an empty reason, a crash).

:func:`architectures` draws a JSON-able spec (tests/corpus/blocks.py builds it); :func:`prepare_spec`
writes it as a recipe folder (a model module holding the spec, generated data, recipe.toml) and runs
the one prepare path on it; :func:`outcome` classifies the result.
"""

from __future__ import annotations

import json
import re
import sys
import traceback
from pathlib import Path

from hypothesis import strategies as st

from tasks.errors import PipelineError
from tasks.prepare.pipeline import prepare
from tasks.recipe.load import load_recipe
from tests.corpus.families import model_fields, trainable_fields
from tests.prepare.kit import merge, toml_value

ACTS = ["relu", "relu6", "silu", "gelu", "hardswish", "leaky", "elu", "mish", "prelu", "sigmoid", "tanh"]
# text a user must never read: C++ positions, ORT's assertion phrasing, tracebacks, empty reasons
UNSPECIFIC = re.compile(
    r"\.(cc|cpp|h):\d+|was false\.|Traceback \(most recent call last\)|^\s+File \"|crashed \(exit -?\d+\):\s*$|"
    r"Non-zero status code|Could not find an implementation|onnxruntime::|std::",
    re.M,
)

MODULE = '''"""A generated model (tests/corpus/generator.py): its spec is the JSON below."""
import json

from tests.corpus.families import build, make_data

SPEC = json.loads({spec!r})


def net(num_classes=4):
    return build(SPEC, num_classes)


def make(out_dir):
    make_data(SPEC, out_dir)
'''


def conv_spec(out: int) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries(
        {"kind": st.just("conv"), "out": st.just(out), "k": st.sampled_from([1, 3, 5]),
         "stride": st.sampled_from([1, 1, 2]), "groups": st.sampled_from([1, 1, 2, "depthwise"]),
         "dilation": st.sampled_from([1, 1, 2]), "bias": st.booleans(),
         "order": st.sampled_from(["cba", "cba", "cab", "bac", "acb"]), "act": st.sampled_from(ACTS)}
    )  # fmt: skip


def block(width: int) -> st.SearchStrategy[dict]:
    simple = {
        "residual": conv_spec(width).map(lambda s: {**s, "kind": "residual"}),
        "dense": conv_spec(4).map(lambda s: {**s, "kind": "dense", "stride": 1}),
        "se": st.fixed_dictionaries({"kind": st.just("se"), "pool": st.sampled_from(["fixed", "adaptive", "mean"])}),
        "pool": st.fixed_dictionaries({"kind": st.just("pool"), "pool": st.sampled_from(["avg", "max", "max_ceil", "avg_ceil"])}),
        "upsample": st.fixed_dictionaries({"kind": st.just("upsample"),
                                           "up": st.sampled_from(["nearest", "bilinear", "transposed", "pixel_shuffle"])}),
        "tokens": st.just({"kind": "tokens"}),
        "attention": st.just({"kind": "attention"}),
        "shared": st.just({"kind": "shared"}),
        "norm": st.fixed_dictionaries({"kind": st.just("norm"), "norm": st.sampled_from(["group", "instance", "layer"])}),
    }  # fmt: skip
    return st.one_of(conv_spec(width), *simple.values())


@st.composite
def architectures(draw: st.DrawFn) -> dict:
    """A spec: input size, blocks (a stem conv first), head, loss (built-in or embedded)."""
    width = draw(st.sampled_from([4, 8]))
    blocks = [draw(conv_spec(width))] + draw(st.lists(block(width), min_size=0, max_size=4))
    head = draw(st.fixed_dictionaries({
        "pool": st.sampled_from(["adaptive", "mean", "fixed", "max"]),
        "flatten": st.sampled_from(["flatten", "view", "reshape"]),
        "hidden": st.sampled_from([0, 0, 16]),
    }))  # fmt: skip
    loss = draw(st.sampled_from(["cross-entropy", "cross-entropy", "embedded"]))
    spec = {"size": draw(st.sampled_from([16, 32])), "blocks": blocks, "head": head, "loss": loss}
    if loss == "embedded":
        spec["labels"] = draw(st.sampled_from(["int64", "int32"]))
    spec["strategy"] = draw(st.sampled_from(["last-conv+classifier", "all", "classifier"]))
    return spec


def recipe_dict(spec: dict, runtime: str = "ort-training") -> dict:
    """The recipe of a spec (written beside its module, gen_model.py), trained by ``runtime``."""
    base = {
        "name": "generated",
        "task": "classification",
        "model": {"callable": "gen_model:net", "num_classes": 4, **model_fields(spec)},
        "trainable": {"strategy": spec["strategy"], "batchnorm": spec.get("batchnorm", "frozen")},
        "loss": {"kind": "cross-entropy"},
        "optimizer": {"kind": "adamw", "lr": 0.01},
        "training": {"batch_size": 8, "epochs": 1, "runtime": runtime},
        "data": {"make": "gen_model:make", "train": "data/train.npz", "test": "data/test.npz"},
    }
    if "family" in spec:
        base["trainable"] = trainable_fields(spec)
    if spec["loss"] == "embedded":
        base = merge(base, {"task": "embedded", "loss": {"kind": "embedded"},
                            "model": {"input_names": ["input", "labels"], "output_names": ["loss", "logits"]},
                            "data": {"feeds": {"input": "x", "labels": "y"}}})  # fmt: skip
    return base


def write_spec(spec: dict, folder: Path, runtime: str = "ort-training") -> Path:
    """The spec as a recipe folder (module, recipe.toml); returns the recipe path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    (folder / "gen_model.py").write_text(MODULE.format(spec=json.dumps(spec)))
    raw = recipe_dict(spec, runtime)
    tables = {k: v for k, v in raw.items() if isinstance(v, dict)}
    lines = [f"{k} = {toml_value(v)}" for k, v in raw.items() if k not in tables]
    for name, table in tables.items():
        lines += [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    (folder / "recipe.toml").write_text("\n".join(lines) + "\n")
    return folder / "recipe.toml"


def outcome(exc: BaseException | None) -> tuple[str, str]:
    """(``pass`` | ``specific`` | ``raw``, the one-line message) of a prepare that raised ``exc``."""
    if exc is None:
        return "pass", ""
    text = str(exc).strip()
    if isinstance(exc, PipelineError) and text and "\n" not in text and not UNSPECIFIC.search(text):
        return "specific", f"{type(exc).__name__}: {text}"
    return "raw", f"{type(exc).__name__}: {text or traceback.format_exception_only(exc)[-1].strip()}"


def prepare_spec(spec: dict, folder: Path, runtime: str = "ort-training") -> tuple[str, str]:
    """Prepare the spec's recipe in ``folder`` under the training ``runtime`` (in this process;
    ONNX Runtime's graph runs happen in their own) and classify what happened."""
    recipe_path = write_spec(spec, folder, runtime)
    sys.modules.pop("gen_model", None)  # each example imports its own module
    try:
        prepare(load_recipe(recipe_path), folder / "out")
    except Exception as exc:  # noqa: BLE001 - every failure is classified
        return outcome(exc)
    return outcome(None)
