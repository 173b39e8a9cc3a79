"""Recipe parsing: every wrong field gives a RecipeError naming it; overrides; hashing."""

from __future__ import annotations

import pytest

from tasks.errors import RecipeError
from tasks.recipe.load import load_recipe, parse_override, parse_recipe, recipe_hash
from tests.prepare.kit import BASE, merge

BAD = [  # (change to the base recipe, field named in the error)
    ({"colour": "blue"}, "colour"),
    ({"model": {"depth": 3}}, "model.depth"),
    ({"training": {"batchsize": 8}}, "training.batchsize"),
    ({"name": "Bad Name!"}, "name"),
    ({"task": "clustering"}, "task"),
    ({"model": None}, "model"),
    ({"model": {"torchvision": "resnet18"}}, "model.torchvision"),
    ({"model": {"callable": "no-colon"}}, "model.callable"),
    ({"model": {"input_shape": [1, 0, 4]}}, "model.input_shape"),
    ({"model": {"input_shape": "1x4x4"}}, "model.input_shape"),
    ({"model": {"num_classes": 0}}, "model.num_classes"),
    ({"model": {"output_names": ["a", 3]}}, "model.output_names"),
    ({"trainable": {"strategy": "last-layer"}}, "trainable.strategy"),
    ({"trainable": {"strategy": None}}, "trainable.strategy"),
    ({"loss": {"kind": "hinge"}}, "loss.kind"),
    ({"loss": {"kind": "custom:nocallable"}}, "loss.kind"),
    ({"loss": {"kind": "embedded"}}, "loss.kind"),
    ({"task": "regression"}, "loss.kind"),
    ({"optimizer": {"kind": "adam"}}, "optimizer.kind"),
    ({"optimizer": {"lr": 0}}, "optimizer.lr"),
    ({"optimizer": {"lr": "fast"}}, "optimizer.lr"),
    ({"training": {"batch_size": 0}}, "training.batch_size"),
    ({"training": {"epochs": True}}, "training.epochs"),
    ({"training": {"epochs": 2.5}}, "training.epochs"),
    ({"schedule": {"final_lr_ratio": 2.0}}, "schedule.final_lr_ratio"),
    ({"data": {"test": None}}, "data.test"),
    ({"data": {"board_train": "/data/train.npz"}}, "data.train"),
    ({"data": {"make": "datasets"}}, "data.make"),
    ({"data": {"feeds": {"labels": 1}}}, "data.feeds"),
    ({"promotion": {"min_gain": "a lot"}}, "promotion.min_gain"),
    (
        {"task": "regression", "loss": {"kind": "mse"}, "promotion": {"metric": "accuracy"}},
        "promotion.metric",
    ),
    ({"trainable": {"strategy": "freeze_net"}}, "trainable.heads"),
    ({"trainable": {"strategy": "freeze_basenet", "heads": ["h.*"]}}, "trainable.backbone"),
    ({"promotion": {"metric": "map50"}}, "promotion.metric"),
    ({"detection": {"classes": ["a"]}}, "detection"),
]

DETECTOR = {  # an embedded-loss model with a [detection] table
    "task": "embedded",
    "loss": {"kind": "embedded"},
    "model": {"output_names": ["loss", "scores", "offsets"], "num_classes": 2},
    "detection": {"classes": ["cat", "dog"]},
}
BAD_DETECTION = [
    ({"detection": {"classes": []}}, "detection.classes"),
    ({"detection": {"classes": ["a", "a"]}}, "detection.classes"),
    ({"detection": {"classes": ["a"], "iou_threshold": 0}}, "detection.iou_threshold"),
    ({"detection": {"classes": ["a"], "score_threshold": 1.5}}, "detection.score_threshold"),
    ({"detection": {"classes": ["a"], "max_detections": 0}}, "detection.max_detections"),
    ({"detection": {"classes": ["a"], "nms": "soft"}}, "detection.nms"),
    ({"model": {"num_classes": 3}}, "detection.classes"),
]


@pytest.mark.parametrize(("change", "field"), BAD_DETECTION, ids=[f for _, f in BAD_DETECTION])
def test_bad_detection_field_is_named(tmp_path, change, field):
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(merge(BASE, DETECTOR), change), tmp_path / "r.toml")
    assert info.value.field == field


def test_detector_is_promoted_on_map50_by_default(tmp_path):
    recipe = parse_recipe(merge(BASE, DETECTOR), tmp_path / "r.toml")
    assert recipe.promotion.metric == "map50"
    assert recipe.detection.classes == ("cat", "dog") and recipe.detection.priors is None
    detector = merge(DETECTOR, {"detection": {"priors": "p.npy"}, "promotion": {"metric": "map"}})
    recipe = parse_recipe(merge(BASE, detector), tmp_path / "r.toml")
    assert recipe.detection.priors == (tmp_path / "p.npy").resolve() and recipe.promotion.metric == "map"


def test_detection_is_a_task_by_name(tmp_path):
    """``task = "detection"`` is a detector whose loss is in its graph: the board's ``embedded`` task,
    its loss kind ``embedded`` unless given; it needs its [detection] table, and a loss of its own
    is refused as for ``embedded``."""
    named = {k: v for k, v in merge(DETECTOR, {"task": "detection"}).items() if k != "loss"}
    recipe = parse_recipe({k: v for k, v in merge(BASE, named).items() if k != "loss"}, tmp_path / "r.toml")
    assert recipe.task == "embedded" and recipe.loss.kind == "embedded" and recipe.promotion.metric == "map50"
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(BASE, {**named, "detection": None}), tmp_path / "r.toml")
    assert info.value.field == "detection" and "task = 'detection'" in str(info.value)
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(BASE, named), tmp_path / "r.toml")  # BASE's cross-entropy
    assert info.value.field == "loss.kind"


@pytest.mark.parametrize(("change", "field"), BAD, ids=[f for _, f in BAD])
def test_bad_field_is_named(tmp_path, change, field):
    with pytest.raises(RecipeError) as info:
        parse_recipe(merge(BASE, change), tmp_path / "r.toml")
    assert info.value.field == field
    assert f"'{field}'" in str(info.value)


def test_promotion_metric_defaults_to_what_the_task_reports(tmp_path):
    """Accuracy for classifiers; loss for regression and embedded-loss models (no accuracy there:
    an embedded recipe used to train on the board, then fail at promotion)."""
    embedded = {"task": "embedded", "loss": {"kind": "embedded"}, "model": {"output_names": ["loss", "out"]}}
    assert parse_recipe(BASE, tmp_path / "r.toml").promotion.metric == "accuracy"
    assert parse_recipe(merge(BASE, embedded), tmp_path / "r.toml").promotion.metric == "loss"
    with pytest.raises(RecipeError, match="promotion.metric"):
        parse_recipe(merge(BASE, {**embedded, "promotion": {"metric": "accuracy"}}), tmp_path / "r.toml")


def test_embedded_needs_loss_first(tmp_path):
    change = {"task": "embedded", "loss": {"kind": "embedded"}, "model": {"output_names": ["loss"]}}
    with pytest.raises(RecipeError, match="model.output_names"):
        parse_recipe(merge(BASE, change), tmp_path / "r.toml")


def test_paths_resolve_against_recipe_folder(tmp_path):
    r = parse_recipe(merge(BASE, {"model": {"weights": "w/base.pt"}}), tmp_path / "r.toml")
    assert r.data.train == tmp_path / "data" / "train.npz"
    assert r.model.weights == tmp_path / "w" / "base.pt"
    assert (r.trainable.strategy, r.loss.kind, r.optimizer.weight_decay) == (
        "classifier",
        "cross-entropy",
        0.01,
    )


def test_custom_loss_reference(tmp_path):
    r = parse_recipe(merge(BASE, {"loss": {"kind": "custom:models:two_head_loss"}}), tmp_path / "r.toml")
    assert (r.loss.kind, r.loss.factory) == ("custom", "models:two_head_loss")


def test_load_with_overrides_and_hash(tmp_path):
    from tasks.paths import PROJECT_ROOT

    path = PROJECT_ROOT / "recipes" / "digits.toml"
    base = load_recipe(path)
    changed = load_recipe(path, {"training.epochs": 7, "optimizer.lr": 0.5})
    assert (changed.training.epochs, changed.optimizer.lr) == (7, 0.5)
    assert recipe_hash(base) == recipe_hash(load_recipe(path)) != recipe_hash(changed)
    with pytest.raises(RecipeError, match="training.epoch'"):
        load_recipe(path, {"training.epoch": 7})


def test_reference_recipes_parse():
    from tasks.paths import PROJECT_ROOT

    recipes = sorted((PROJECT_ROOT / "recipes").glob("*.toml"))
    assert {r.stem for r in recipes} >= {"digits", "mobilenet_v2", "two_head_custom_loss", "embedded_loss"}
    for path in recipes:
        assert load_recipe(path).source == path


def test_file_errors(tmp_path):
    with pytest.raises(RecipeError, match="existing recipe file"):
        load_recipe(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("name = [unclosed\n")
    with pytest.raises(RecipeError, match="valid TOML"):
        load_recipe(tmp_path / "bad.toml")


def test_parse_override():
    assert parse_override("training.epochs=5") == ("training.epochs", 5)
    assert parse_override("loss.kind=mse") == ("loss.kind", "mse")
    assert parse_override("model.input_shape=[1, 8, 8]") == ("model.input_shape", [1, 8, 8])
    with pytest.raises(RecipeError, match="key=value"):
        parse_override("epochs")
