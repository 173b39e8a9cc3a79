"""Deterministic data generators of the reference recipes (``[data].make = "datasets:<callable>"``).

Each generator takes the folder the recipe's data files live in and writes ``.npz`` files with
``x`` (float32, NCHW) and ``y`` (int64 class labels) there, seeded so every run writes the same data.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

SHIFT_ANGLE = 35.0  # degrees: the "device domain" is rotated digits ...
SHIFT_NOISE = 0.2  # ... with additive Gaussian noise
# the first 900 digits of the seeded order are the clean pretraining digits: the models train on the
# first 750 and are checked on the other 150 (their held-out set: no test set or board shard uses them)
PRE, PRE_HELDOUT = slice(0, 750), slice(750, 900)


def _sibling_models():
    """Import models.py from this folder (works wherever the recipes folder was copied)."""
    spec = importlib.util.spec_from_file_location(
        "_odl_recipes_models", Path(__file__).with_name("models.py")
    )
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _save(path: Path, x: np.ndarray, y: np.ndarray, **extra: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, x=x.astype(np.float32), y=y.astype(np.int64), **extra)
    tmp.replace(path)


def shift_domain(x: np.ndarray, seed: int) -> np.ndarray:
    """Rotate each 8x8 digit by about SHIFT_ANGLE degrees and add Gaussian noise."""
    from scipy.ndimage import rotate

    rng = np.random.default_rng(seed)
    angles = SHIFT_ANGLE + rng.uniform(-8, 8, len(x))
    out = np.stack(
        [
            rotate(img[0], a, reshape=False, order=1, mode="constant")[None]
            for img, a in zip(x, angles, strict=True)
        ]
    )
    return (out + rng.normal(0, SHIFT_NOISE, out.shape)).astype(np.float32)


def _digits(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    order = np.random.default_rng(seed).permutation(len(d.target))
    x = (d.images[order] / 16.0).astype(np.float32)[:, None]
    return x, d.target[order].astype(np.int64)


def pretrain_base(x: np.ndarray, y: np.ndarray, out_dir: Path) -> None:
    """The student's ``base_weights.pt``: the digits CNN pretrained on the clean digits of PRE until
    it classifies those of PRE_HELDOUT at its target (``models.pretrain_digits``)."""
    heldout = (x[PRE_HELDOUT], y[PRE_HELDOUT])
    _sibling_models().pretrain_digits(x[PRE], y[PRE], heldout, Path(out_dir) / "base_weights.pt")


def digits_shifted(out_dir: Path) -> None:
    """Write base_weights.pt (pretrained on clean digits), train/eval/test (shifted) and clean_test.

    The board's train set is 300 shifted digits plus a replay of 100 clean digits it saw before the
    drift (from the pretraining set): without them the fine-tuned model forgets the clean domain
    (clean accuracy 0.99 -> 0.83), which the promotion gate's guard of ``clean`` refuses."""
    out_dir = Path(out_dir)
    x, y = _digits()
    clean, rest = slice(900, 1100), slice(1100, None)
    xs, ys = shift_domain(x[rest], seed=1), y[rest]
    _save(out_dir / "clean_test.npz", x[clean], y[clean])
    _save(out_dir / "train.npz", np.concatenate([xs[:300], x[:100]]), np.concatenate([ys[:300], y[:100]]))
    _save(out_dir / "eval.npz", xs[400:500], ys[400:500])
    _save(out_dir / "test.npz", xs[500:], ys[500:])
    pretrain_base(x, y, out_dir)


def digits_nightly(out_dir: Path) -> None:
    """The shifted digits of :func:`digits_shifted` (same base weights and test sets) with the board's
    data as three shards in ``shards/``, which a nightly demo appends to the board one per night:
    shard-0001 holds what the board saw before the drift (100 clean and 100 shifted digits),
    shard-0002 300 shifted digits, shard-0003 100 more; ``heldout/`` holds each shard's held-out part
    (100 digits of the same kind, 47 for shard-0003)."""
    out_dir = Path(out_dir)
    digits_shifted(out_dir)
    x, y = _digits()
    xs, ys = shift_domain(x[1100:], seed=1), y[1100:]
    shards = {
        "shard-0001.npz": (np.concatenate([x[:100], xs[:100]]), np.concatenate([y[:100], ys[:100]])),
        "shard-0002.npz": (xs[100:400], ys[100:400]),
        "shard-0003.npz": (xs[400:500], ys[400:500]),
    }
    for name, (sx, sy) in shards.items():
        _save(out_dir / "shards" / name, sx, sy)
    heldout = {  # each shard's held-out part, kept on the host: the nightly report's forgetting figures
        "shard-0001.npz": (
            np.concatenate([x[1050:1100], xs[500:550]]),
            np.concatenate([y[1050:1100], ys[500:550]]),
        ),
        "shard-0002.npz": (xs[550:650], ys[550:650]),
        "shard-0003.npz": (xs[650:], ys[650:]),
    }
    for name, (hx, hy) in heldout.items():
        _save(out_dir / "heldout" / name, hx, hy)


def augment(x: np.ndarray, copies: int, seed: int) -> np.ndarray:
    """``copies`` randomly rotated (-50..50 degrees) and noised (sigma 0..0.25) versions of each digit."""
    from scipy.ndimage import rotate

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(copies):
        angles, sigma = rng.uniform(-50, 50, len(x)), rng.uniform(0, 0.25, (len(x), 1, 1, 1))
        rot = np.stack([rotate(img[0], a, reshape=False, order=1, mode="constant")[None]
                        for img, a in zip(x, angles, strict=True)])  # fmt: skip
        out.append(rot + rng.normal(0, 1, rot.shape) * sigma)
    return np.concatenate(out).astype(np.float32)


def digits_teacher(out_dir: Path) -> None:
    """A teacher and a student for learning from unlabeled board data: ``teacher.onnx`` (a larger CNN
    trained on the host on the clean pretraining digits of PRE, with fresh random rotations and noise
    each epoch, until it classifies shifted copies of the PRE_HELDOUT digits at its target:
    ``models.train_digits_teacher``), the student's ``base_weights.pt`` (:func:`pretrain_base`), the
    shifted test set (197) and the clean one (200), the board's two nights of unlabeled shifted
    digits, ``shards/shard-000{1,2}.npz`` (250 each, ``x`` only; their withheld labels are in
    ``truth/`` for measuring the teacher's pseudo-labels, never sent), and the 100 labelled clean
    digits the board holds from before the drift, ``shards/delivered-clean.npz`` (pretraining digits,
    the student's replay: without them two nights on the teacher's labels of shifted digits cost its
    clean accuracy 0.03-0.045, beyond the gate's tolerance)."""
    out_dir = Path(out_dir)
    x, y = _digits()
    clean, rest = slice(900, 1100), slice(1100, None)
    xs, ys = shift_domain(x[rest], seed=1), y[rest]
    _save(out_dir / "clean_test.npz", x[clean], y[clean])
    _save(out_dir / "test.npz", xs[500:], ys[500:])
    _save(out_dir / "shards" / "delivered-clean.npz", x[:100], y[:100])
    for night, rows in enumerate((slice(0, 250), slice(250, 500)), start=1):
        path = out_dir / "shards" / f"shard-{night:04d}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, x=xs[rows].astype(np.float32))
        (out_dir / "truth").mkdir(exist_ok=True)
        np.savez(out_dir / "truth" / path.name, y=ys[rows].astype(np.int64))
    pretrain_base(x, y, out_dir)
    seeds = (31, 32)  # two shifted copies of each held-out digit: 300 samples
    heldout = (
        np.concatenate([shift_domain(x[PRE_HELDOUT], seed=s) for s in seeds]),
        np.tile(y[PRE_HELDOUT], 2),
    )

    def epoch_data(epoch: int) -> tuple[np.ndarray, np.ndarray]:
        augmented = augment(x[PRE], copies=3, seed=100 + epoch)
        return np.concatenate([x[PRE], augmented]), np.tile(y[PRE], 4)

    _sibling_models().train_digits_teacher(epoch_data, heldout, out_dir / "teacher.onnx")


FLEET_SIZES = (1, 2, 4, 8)
FLEET_ALPHA = 0.5  # Dirichlet concentration of the label split: small = each board sees few classes


def fleet_min_samples(samples: int, boards: int) -> int:
    """The fewest samples :func:`noniid_split` leaves a board: 10, or half a board's even share when
    that is less (700 samples: 10 up to 35 boards, 5 for 64 boards)."""
    return max(1, min(10, samples // (2 * boards)))


def noniid_split(
    y: np.ndarray, boards: int, alpha: float = FLEET_ALPHA, seed: int = 0, min_samples: int | None = None
) -> list[np.ndarray]:
    """Indices of ``y`` per board: each class is shared out by Dirichlet(``alpha``) proportions
    (Hsu et al., 2019), the usual label-skewed federated split. A board left with fewer than
    ``min_samples`` (default :func:`fleet_min_samples`) is then topped up one sample at a time from
    the largest board, preferring the classes it already holds (so a small board stays skewed).
    One draw: for 1-32 boards of the 700 fleet digits at alpha 0.5 no board needs a top-up."""
    if min_samples is None:
        min_samples = fleet_min_samples(len(y), boards)
    if min_samples * boards > len(y):
        raise ValueError(f"{len(y)} samples cannot give {boards} boards {min_samples} each")
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(boards)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        cuts = (np.cumsum(rng.dirichlet([alpha] * boards)) * len(idx)).astype(int)[:-1]
        for b, chunk in enumerate(np.split(idx, cuts)):
            parts[b].extend(chunk.tolist())
    while min(len(p) for p in parts) < min_samples:
        small = min(range(boards), key=lambda b: len(parts[b]))
        large = max(range(boards), key=lambda b: len(parts[b]))
        held = set(y[parts[small]].tolist())
        same = [i for i in parts[large] if y[i] in held]
        pick = int(rng.choice(same or parts[large]))
        parts[large].remove(pick)
        parts[small].append(pick)
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


def fleet_pool() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fleet's shifted digits: (pool x, pool y) of 700 samples the boards share, (test x, test y)
    of 197 for the host."""
    x, y = _digits()
    xs, ys = shift_domain(x[900:], seed=11), y[900:]
    return xs[:700], ys[:700], xs[700:], ys[700:]


def fleet_split(
    folder: Path, boards: int, alpha: float = FLEET_ALPHA, seed: int | None = None, pool: tuple | None = None
) -> list[int]:
    """Write ``folder/board-I.npz`` for a fleet of ``boards`` (:func:`noniid_split` of
    :func:`fleet_pool`, seeded by ``boards`` unless ``seed``); returns each board's sample count."""
    pool_x, pool_y = (pool or fleet_pool())[:2]
    sizes = []
    for i, idx in enumerate(noniid_split(pool_y, boards, alpha, boards if seed is None else seed)):
        _save(Path(folder) / f"board-{i}.npz", pool_x[idx], pool_y[idx])
        sizes.append(len(idx))
    return sizes


def digits_fleet(out_dir: Path) -> None:
    """A fleet's shifted digits: the base model of :func:`digits_shifted` (pretrained on clean
    digits), a host test set of 197 shifted digits, and each board's own shifted digits split
    non-IID (:func:`fleet_split`) for fleets of 1, 2, 4 and 8 boards:
    ``boards-N/board-I.npz`` (the 1-board split holds all 700 samples: centralised training).
    Other fleet sizes and alphas: ``fleet_split`` (``bench/fleet.py`` writes its own)."""
    out_dir = Path(out_dir)
    pool = fleet_pool()
    _save(out_dir / "test.npz", pool[2], pool[3])
    for n in FLEET_SIZES:
        fleet_split(out_dir / f"boards-{n}", n, pool=pool)
    x, y = _digits()
    pretrain_base(x, y, out_dir)


def digits_two_head(out_dir: Path) -> None:
    """Shifted digits with an extra ``aux`` target (mean ink per image) for the two-head recipe."""
    out_dir = Path(out_dir)
    x, y = _digits(seed=2)
    xs = shift_domain(x, seed=3)
    aux = x.reshape(len(x), -1).mean(axis=1, keepdims=True).astype(np.float32)
    _save(out_dir / "train.npz", xs[:1200], y[:1200], aux=aux[:1200])
    _save(out_dir / "test.npz", xs[1200:], y[1200:], aux=aux[1200:])


def two_textures(out_dir: Path, *, n_train: int = 256, n_test: int = 64, size: int = 224) -> None:
    """Two learnable 3x``size``x``size`` image classes: horizontal vs vertical stripes, random phase/colour."""
    out_dir = Path(out_dir)
    rng = np.random.default_rng(7)

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 2, n)
        grid = np.arange(size, dtype=np.float32)
        x = np.empty((n, 3, size, size), np.float32)
        for i in range(n):
            period, phase = rng.uniform(8, 24), rng.uniform(0, 2 * np.pi)
            wave = np.sin(2 * np.pi * grid / period + phase)
            img = wave[:, None] * np.ones(size)[None] if y[i] == 0 else np.ones(size)[:, None] * wave[None]
            colour = rng.uniform(0.5, 1.5, 3).astype(np.float32)[:, None, None]
            x[i] = colour * img[None] + rng.normal(0, 0.3, (3, size, size))
        return x, y

    _save(out_dir / "train.npz", *make(n_train))
    _save(out_dir / "test.npz", *make(n_test))


def textures_and_features(out_dir: Path) -> None:
    """:func:`two_textures` and the MobileNetV2 weights the STM32 wiki recipe starts from
    (``models.mobilenet_v2_features``: ImageNet's from torchvision's hub cache when present, else a
    short pretraining on generated textures of another task on this host): a model with random
    features keeps its loss at ln 2 on the board. The recipe measures their BatchNorm statistics on
    its own images (``[trainable] batchnorm_calibration``)."""
    start = time.perf_counter()
    two_textures(out_dir)
    with np.load(Path(out_dir) / "train.npz") as train, np.load(Path(out_dir) / "test.npz") as test:
        images, tests = train["x"], len(test["y"])
    took = time.perf_counter() - start
    print(
        f"  textures: {len(images)} train, {tests} test images of {images.shape[-1]} px ({took:.1f} s)",
        flush=True,
    )
    origin = _sibling_models().mobilenet_v2_features(Path(out_dir) / "mobilenet_v2_features.pt")
    print(f"mobilenet_v2 weights: {origin} ({time.perf_counter() - start:.1f} s in all)", flush=True)


def shapes_detection(out_dir: Path, size: int = 300, n_train: int = 128, n_test: int = 64) -> None:
    """The synthetic shapes detection set (tasks.detection.synthetic) as the SSD-Lite recipe's
    npz files (tasks.detection.annotations.detection_arrays: images centred as (pixel - 0.5) /
    0.25, per-prior targets matched to the priors of recipes/ssdlite.py at ``size``, and the
    ground-truth boxes). The PNG + COCO + VOC files stay beside them (``shapes-<split>/``), as a
    user's data would be: a user's own set goes through ``load_coco`` or ``load_voc`` the same way."""
    from ssdlite import priors_for

    from tasks.detection.annotations import detection_arrays, load_coco
    from tasks.detection.synthetic import CLASSES, write_set

    priors = priors_for(size)
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 1)):
        items = load_coco(write_set(out_dir / f"shapes-{split}", n, size, seed), CLASSES)
        arrays = detection_arrays(items, priors, size)
        _save(out_dir / f"shapes_{split}.npz", arrays.pop("x"), arrays.pop("y"), **arrays)


def shapes_teacher(
    out_dir: Path, size: int = 96, teacher_images: int = 512, teacher_epochs: int = 30
) -> None:
    """A detector teacher and an SSD-Lite student on the shapes, at ``size`` px: ``teacher.onnx`` (an
    SSD-Lite on a 1.4x-wide MobileNetV2, trained on the host on 512 annotated images for 30 epochs
    (8 min on 2 cores; mAP@0.5 0.33 on the test set), exported as
    ``images -> (scores, boxes)``), the student's ``base_weights.pt`` (SSD-Lite pretrained on 64
    annotated images), the annotated test set (64) and the board's two nights of unlabeled images,
    ``shards/shard-000{1,2}.npz`` (128 each, ``x`` only; their boxes stay in ``truth/``)."""
    import torch
    from ssdlite import DecodedDetector, SSDLite, priors_for, train_detector

    from tasks.detection.annotations import detection_arrays, load_coco
    from tasks.detection.synthetic import CLASSES, write_set

    out_dir = Path(out_dir)
    priors = priors_for(size)

    def annotated(name: str, n: int, seed: int) -> dict[str, np.ndarray]:
        return detection_arrays(load_coco(write_set(out_dir / name, n, size, seed), CLASSES), priors, size)

    test = annotated("shapes-test", 64, 1)
    _save(out_dir / "test.npz", test.pop("x"), test.pop("y"), **test)
    for night in (1, 2):
        board = annotated(f"board-{night}", 128, 10 + night)
        (out_dir / "shards").mkdir(parents=True, exist_ok=True)
        np.savez(out_dir / "shards" / f"shard-{night:04d}.npz", x=board["x"])
        (out_dir / "truth").mkdir(exist_ok=True)
        np.savez(
            out_dir / "truth" / f"shard-{night:04d}.npz",
            gt_boxes=board["gt_boxes"],
            gt_labels=board["gt_labels"],
        )
    torch.manual_seed(0)
    student = train_detector(SSDLite(len(CLASSES), size), annotated("student-train", 64, 6), epochs=15)
    torch.save(student.state_dict(), out_dir / "base_weights.pt")
    torch.manual_seed(0)
    teacher = train_detector(SSDLite(len(CLASSES), size, width=1.4), annotated("teacher-train", teacher_images, 5),
                             epochs=teacher_epochs)  # fmt: skip
    tmp = out_dir / "teacher.tmp.onnx"
    torch.onnx.export(DecodedDetector(teacher).eval(), (torch.zeros(1, 3, size, size),), str(tmp),
                      input_names=["images"], output_names=["scores", "boxes"], opset_version=17, dynamo=False,
                      dynamic_axes={"images": {0: "N"}, "scores": {0: "N"}, "boxes": {0: "N"}})  # fmt: skip
    tmp.replace(out_dir / "teacher.onnx")


def shapes_teacher_small(out_dir: Path) -> None:
    """:func:`shapes_teacher` with a teacher trained on 320 images for 14 epochs (about 2.5 min), for CI."""
    shapes_teacher(out_dir, teacher_images=320, teacher_epochs=14)


def shapes_detection_small(out_dir: Path) -> None:
    """:func:`shapes_detection` at 96 px (128 train / 64 test images), for tests and CI."""
    shapes_detection(out_dir, size=96, n_train=128, n_test=64)


def export_foreign(model, example, out: Path, opset: int = 13) -> Path:
    """Export ``model`` the way the STM32 wiki's section 4.1 does: eval mode, constant folding
    (BatchNorm folded into the convolutions, ``onnx::Conv_*`` weights), a fixed batch of one: the
    kind of ONNX file a user gets from a model zoo or a colleague."""
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(model.eval(), example, str(tmp), opset_version=opset, do_constant_folding=True,
                          dynamo=False, input_names=["input"], output_names=["logits"])  # fmt: skip
    tmp.replace(out)
    return out


def digits_foreign(out_dir: Path) -> None:
    """:func:`digits_shifted` plus ``digits_cnn_eval.onnx``: the pretrained digits CNN as a foreign
    eval-mode ONNX file (opset 13, BN folded), for the ONNX-in recipe."""
    import torch

    out_dir = Path(out_dir)
    digits_shifted(out_dir)
    model = _sibling_models().digits_cnn(10)
    model.load_state_dict(torch.load(out_dir / "base_weights.pt", weights_only=True))
    export_foreign(model, torch.zeros(1, 1, 8, 8), out_dir / "digits_cnn_eval.onnx")


def mobilenet_foreign(out_dir: Path) -> None:
    """:func:`two_textures` plus ``mobilenet_v2_eval.onnx``: torchvision's mobilenet_v2 exported as
    the wiki's section 4.1 does. No weights can be downloaded here: its weights are random, its
    BatchNorm statistics calibrated on 64 training images (:func:`calibrate_batchnorm`)."""
    import torch
    from torchvision.models import mobilenet_v2

    out_dir = Path(out_dir)
    two_textures(out_dir)
    torch.manual_seed(0)
    model = mobilenet_v2(weights=None)
    calibrate_batchnorm(model, np.load(out_dir / "train.npz")["x"][:64])
    export_foreign(model, torch.zeros(1, 3, 224, 224), out_dir / "mobilenet_v2_eval.onnx")


def calibrate_batchnorm(model, x: np.ndarray, batch: int = 16) -> None:
    """Set every BatchNorm's running statistics to the mean/variance of its input over ``x``
    (forward passes only, no weight changes): a randomly initialised network then normalises its
    activations as a trained one does, instead of saturating them."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches
    model.train()
    with torch.no_grad():
        for i in range(0, len(x), batch):
            model(torch.from_numpy(x[i : i + batch]))
    model.eval()
