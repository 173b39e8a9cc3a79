"""Keypoints corpus benchmark: pose-estimation model idioms (bench/pose_zoo.py) through ``prepare``
as task ``keypoints`` (export, ORT training artifacts with the keypoints MSE built in the graph,
the offline validation whose probe trains a few steps on the board's runtime and the judging
rehearsal's OKS AP), classified pass / specific (one line of the host error tree) / raw.

The corpus: SimpleBaseline heads on torchvision's ResNet-18 and MobileNetV2 (heatmaps at a quarter
of the input), the recipes' U-Net as a heatmap model in four idioms, DeepPose-style coordinate
regression on ResNet-18, integral regression (soft-argmax over the U-Net's heatmaps, [N, K, 2]) and a
one-stack hourglass. Each runs in its own subprocess on generated stick figures
(``recipes/stick_figures.py``, 5 keypoints) at 64 px (torchvision backbones) or 32 px.

    .venv/bin/python bench/keypoints_corpus.py                 # the whole corpus (~5 min on 2 cores)
    .venv/bin/python bench/keypoints_corpus.py --quick 2 --seed 3   # a seeded sample (the tests' smoke)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._corpus import corpus_main, prepared_row  # noqa: E402
from bench.zoo import calibrate_module  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

SAMPLES = 16
HEAD = "last-conv+classifier"
# name -> (pose_zoo kind, its arguments, input side, trainable strategy); the torchvision backbones'
# deep random init gets BatchNorm statistics of the data (as zoo.py does) and trains its head
CORPUS: dict[str, tuple[str, dict, int, str]] = {
    "simplebaseline-resnet18": ("simplebaseline", {"backbone": "resnet18"}, 64, HEAD),
    "simplebaseline-mobilenet_v2": ("simplebaseline", {"backbone": "mobilenet_v2"}, 64, HEAD),
    "regression-resnet18": ("regression", {"side": 64}, 64, HEAD),
    "unet-nearest": ("unet", {}, 32, "all"),
    "unet-bilinear": ("unet", {"up": "bilinear"}, 32, "all"),
    "unet-transpose": ("unet", {"up": "transpose"}, 32, "all"),
    "unet-groupnorm": ("unet", {"norm": "group"}, 32, "all"),
    "integral-unet": ("integral", {"side": 32}, 32, "all"),
    "integral-unet-matrix": ("integral", {"side": 32, "expect": "matrix"}, 32, "all"),
    "integral-unet-vector": ("integral", {"side": 32, "expect": "vector"}, 32, "all"),
    "hourglass": ("hourglass", {}, 32, "all"),
}
MODULE = '''"""The corpus' model builder (written by bench/keypoints_corpus.py)."""
import sys
sys.path.insert(0, {root!r})
from bench.pose_zoo import build  # noqa: E402,F401
'''


def write_case(name: str, work: Path) -> Path:
    """The case's recipe folder in ``work`` (data, model module, weights, recipe.toml); returns it."""
    import numpy as np

    sys.path.insert(0, str(PROJECT_ROOT / "recipes"))
    from stick_figures import make_set

    kind, args, side, strategy = CORPUS[name]
    (work / "data").mkdir(parents=True, exist_ok=True)
    for split, seed in (("train", 0), ("test", 1)):
        x, y = make_set(SAMPLES, "field", seed, size=side)
        np.savez(work / "data" / f"{split}.npz", x=x, y=y)
    (work / "corpus_model.py").write_text(MODULE.format(root=str(PROJECT_ROOT)))
    kwargs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in {"kind": kind, **args}.items())
    model = f'callable = "corpus_model:build"\nkwargs = {{{kwargs}}}'
    if kind in ("simplebaseline", "regression"):
        from bench.pose_zoo import build

        calibrate_module(build(kind, **args), work / "data" / "train.npz", work / "weights.pt")
        model += '\nweights = "weights.pt"'
    recipe = work / "recipe.toml"
    recipe.write_text(
        f'name = "kp-{name.lower().replace("_", "-")}"\ntask = "keypoints"\n'
        f"[model]\n{model}\ninput_shape = [3, {side}, {side}]\n"
        f'[trainable]\nstrategy = "{strategy}"\n[loss]\nkind = "mse"\n[keypoints]\ncount = 5\n'
        "[training]\nbatch_size = 4\nepochs = 1\n"
        '[data]\ntrain = "data/train.npz"\ntest = "data/test.npz"\n'
    )
    return recipe


def child(name: str, work: Path) -> dict:
    """Prepare one case in ``work``; its row (pipeline errors are classified, never raised)."""
    return prepared_row(name, CORPUS[name][2], lambda: write_case(name, work), work / "prepared")


if __name__ == "__main__":
    sys.exit(corpus_main(__doc__, "keypoints_corpus", list(CORPUS), __file__, child))
