"""Segmentation corpus benchmark: public segmentation models and hand-written U-Net idioms through
``prepare`` as task ``segmentation`` (export, ORT training artifacts with the per-pixel loss, the
offline validation whose probe trains a few steps on the board's runtime), classified pass /
specific (one line of the host error tree) / raw (anything else).

The corpus: torchvision's segmentation heads by name (``[model] torchvision``, random init, no
backbone download), segmentation-models-pytorch (smp) architectures on a ResNet-18 or MobileNetV2
encoder (``encoder_weights=None``), and the U-Net variants of ``recipes/unet.py`` (upsampling by
nearest, bilinear or transposed convolution, GroupNorm or no normalisation, Dropout2d, three levels).
Each model runs in its own subprocess on generated shapes (``recipes/seg_shapes.py``) at the smallest
input size its architecture takes (64 px, PSPNet 192, PAN 256; the U-Nets 32), with 4 classes and
the ignore index 255.

    .venv/bin/python bench/segmentation_corpus.py                 # the whole corpus (~20 min on 2 cores)
    .venv/bin/python bench/segmentation_corpus.py --quick 3 --seed 7   # a seeded sample (the tests' smoke)
    .venv/bin/python bench/segmentation_corpus.py --models unet-bilinear,smp-fpn
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._corpus import corpus_main, prepared_row  # noqa: E402
from bench.zoo import calibrate_module  # noqa: E402
from tasks.paths import PROJECT_ROOT  # noqa: E402

CLASSES = 4
SAMPLES = 16
# name -> (family, its builder's arguments, input side); torchvision and smp models train their
# last conv + classifier after BatchNorm calibration (a deep random init), the U-Nets every parameter
CORPUS: dict[str, tuple[str, dict, int]] = {
    "tv-lraspp_mobilenet_v3_large": ("tv", {"name": "lraspp_mobilenet_v3_large"}, 64),
    "tv-deeplabv3_mobilenet_v3_large": ("tv", {"name": "deeplabv3_mobilenet_v3_large"}, 64),
    "tv-fcn_resnet50": ("tv", {"name": "fcn_resnet50"}, 64),
    "tv-deeplabv3_resnet50": ("tv", {"name": "deeplabv3_resnet50"}, 64),
    "smp-unet-resnet18": ("smp", {"arch": "Unet", "encoder": "resnet18"}, 64),
    "smp-fpn-resnet18": ("smp", {"arch": "FPN", "encoder": "resnet18"}, 64),
    "smp-deeplabv3plus-resnet18": ("smp", {"arch": "DeepLabV3Plus", "encoder": "resnet18"}, 64),
    "smp-linknet-resnet18": ("smp", {"arch": "Linknet", "encoder": "resnet18"}, 64),
    "smp-pspnet-resnet18": (
        "smp",
        {"arch": "PSPNet", "encoder": "resnet18"},
        192,
    ),  # pools of 1, 2, 3, 6 cells
    "smp-pan-resnet18": ("smp", {"arch": "PAN", "encoder": "resnet18"}, 256),  # pools 1/256 of the input
    "smp-manet-resnet18": ("smp", {"arch": "MAnet", "encoder": "resnet18"}, 64),
    "smp-unetplusplus-resnet18": ("smp", {"arch": "UnetPlusPlus", "encoder": "resnet18"}, 64),
    "smp-unet-mobilenet_v2": ("smp", {"arch": "Unet", "encoder": "mobilenet_v2"}, 64),
    "smp-segformer-mit_b0": ("smp", {"arch": "Segformer", "encoder": "mit_b0"}, 64),
    "unet-nearest": ("unet", {}, 32),
    "unet-bilinear": ("unet", {"up": "bilinear"}, 32),
    "unet-transpose": ("unet", {"up": "transpose"}, 32),
    "unet-groupnorm": ("unet", {"norm": "group"}, 32),
    "unet-no-norm": ("unet", {"norm": "none"}, 32),
    "unet-dropout2d": ("unet", {"dropout": 0.1}, 32),
    "unet-depth3": ("unet", {"depth": 3}, 32),
}
MODULE = '''"""The corpus' model builders (written by bench/segmentation_corpus.py)."""
import sys
sys.path.insert(0, {recipes!r})


def smp_model(arch, encoder, num_classes=4):
    import segmentation_models_pytorch as smp
    return getattr(smp, arch)(encoder_name=encoder, encoder_weights=None, classes=num_classes)


def unet_model(num_classes=4, **kwargs):
    from unet import unet
    return unet(num_classes, **kwargs)
'''


def write_case(name: str, work: Path) -> Path:
    """The case's recipe folder in ``work`` (data, model module, weights, recipe.toml); returns it."""
    import numpy as np

    sys.path.insert(0, str(PROJECT_ROOT / "recipes"))
    from seg_shapes import make_set

    family, args, side = CORPUS[name]
    (work / "data").mkdir(parents=True, exist_ok=True)
    for split, seed in (("train", 0), ("test", 1)):
        x, y = make_set(SAMPLES, "field", seed, size=side)
        np.savez(work / "data" / f"{split}.npz", x=x, y=y)
    (work / "corpus_model.py").write_text(MODULE.format(recipes=str(PROJECT_ROOT / "recipes")))
    if family == "tv":
        model = f'torchvision = "{args["name"]}"'
    else:
        kwargs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items())
        model = f'callable = "corpus_model:{family}_model"\nkwargs = {{{kwargs}}}'
    if family != "unet":  # a deep random init: BatchNorm statistics of its data, as zoo.py does
        calibrate_module(_public_model(family, args, work), work / "data" / "train.npz", work / "weights.pt")
        model += '\nweights = "weights.pt"'
    trainable = "all" if family == "unet" else "last-conv+classifier"
    recipe = work / "recipe.toml"
    recipe.write_text(
        f'name = "seg-{name.lower().replace("_", "-")}"\ntask = "segmentation"\n'
        f"[model]\n{model}\nnum_classes = {CLASSES}\ninput_shape = [3, {side}, {side}]\n"
        f'[trainable]\nstrategy = "{trainable}"\n[loss]\nkind = "cross-entropy"\n'
        "[training]\nbatch_size = 4\nepochs = 1\n"
        '[data]\ntrain = "data/train.npz"\ntest = "data/test.npz"\n'
    )
    return recipe


def _public_model(family: str, args: dict, work: Path):  # noqa: ANN202 - a torch.nn.Module
    """A torchvision or smp case's model as its recipe builds it (random init, seed 0)."""
    import torch
    from torchvision import models

    torch.manual_seed(0)
    if family == "tv":
        return models.get_model(args["name"], weights=None, weights_backbone=None, num_classes=CLASSES)
    sys.path.insert(0, str(work))
    from corpus_model import smp_model

    return smp_model(num_classes=CLASSES, **args)


def child(name: str, work: Path) -> dict:
    """Prepare one case in ``work``; its row (pipeline errors are classified, never raised)."""
    return prepared_row(name, CORPUS[name][2], lambda: write_case(name, work), work / "prepared")


if __name__ == "__main__":
    sys.exit(corpus_main(__doc__, "segmentation_corpus", list(CORPUS), __file__, child))
