"""The typed recipe: what a recipe TOML file becomes after parsing and validation.

Parsing lives in :mod:`tasks.recipe.load` (``load_recipe``, ``parse_recipe``, ``apply_overrides``);
this module only holds the value objects every stage shares. Paths are absolute after parsing
(relative ones are resolved against the recipe file's folder).

Recipe TOML layout (every table and key; unknown keys are errors)::

    name = "digits"                       # [a-z0-9_-], names runs and registry folders
    task = "classification"               # classification | binary | regression | embedded

    [model]
    torchvision = "mobilenet_v2"          # exactly one of: torchvision / callable / onnx
    # callable = "models:digits_cnn"      #   module:callable (recipe folder is on sys.path)
    # onnx = "path/model.onnx"            #   an existing ONNX file (training- or eval-mode export,
                                          #   BN folded or not, opset 13-21, external data allowed)
    # cut_at = ["tensor"]                 #   onnx only: drop everything after these tensors
    num_classes = 2                       # torchvision: replaces the classifier head
    weights = "weights/base.pt"           # optional local state_dict file
    kwargs = {}                           # passed to the callable / torchvision builder
    input_shape = [3, 224, 224]           # one sample, without the batch axis
    input_names = ["input"]               # default ["input"]
    output_names = ["output"]             # default ["output"]; embedded: ["loss", ...]

    [trainable]                           # at least one of strategy / names / patterns
    strategy = "last-conv+classifier"     # classifier | last-conv+classifier | all |
                                          # freeze_net (the heads only) |
                                          # freeze_basenet (everything but the backbone)
    backbone = ["stem.*", "trunk.*"]      # fnmatch globs: the backbone (freeze_basenet)
    heads = ["cls_heads.*"]               # fnmatch globs: the heads (freeze_net)
    names = []                            # explicit parameter (initializer) names
    patterns = []                         # fnmatch globs over parameter names
    train_from = "node or tensor"         # nothing before it receives gradients (an ONNX node
                                          #   or tensor name; the [head] is always after it)
    batchnorm = "frozen"                  # frozen: every BatchNorm normalises with its running
                                          #   statistics in training as at inference (its scale and
                                          #   bias stay trainable when chosen) | batch-stats: ORT's
                                          #   training graph normalises with batch statistics

    [head]                                # optional, with model.cut_at (one tensor): a new head
    num_classes = 2                       # Linear to num_classes outputs
    hidden = 0                            # > 0: a hidden Linear + ReLU of this width first
    pool = "auto"                         # auto: global average pool + flatten a 4-D cut tensor
                                          # | none: flatten only
    seed = 0                              # seeded initialisation (as torch.nn.Linear)

    [loss]
    kind = "cross-entropy"                # mse | cross-entropy | bce-with-logits | l1 |
                                          # custom:module:factory | embedded

    [optimizer]
    kind = "adamw"                        # adamw | sgd
    lr = 1e-3
    weight_decay = 0.01                   # adamw only

    [schedule]
    warmup_steps = 0
    final_lr_ratio = 0.0                  # linear decay to lr * ratio at the last step

    [training]
    batch_size = 16
    epochs = 3
    checkpoint_every = 50                 # steps; 0 = epoch ends only
    log_every = 1
    seed = 0
    start_from = "base"                   # base | current: the weights of the model in service
                                          #   for this recipe and board (warm start)
    prefix_cache = "auto"                 # auto: when every trainable parameter follows one tensor
                                          #   and the part before it is deterministic, the board runs
                                          #   that frozen prefix once per sample and trains the rest
                                          #   on its cached outputs (same results) | off
    cache_dtype = "float32"               # float32 (exact) | float16 (half the memory)
    cache_store = "auto"                  # auto (RAM when it fits half the free RAM, else disk) |
                                          #   ram | disk

    [data]
    make = "datasets:digits_shifted"      # optional module:callable(out_dir: Path) that writes
                                          # the npz files below when they are missing
    train = "data/digits/train.npz"       # host file uploaded to the board (content-addressed)
    # board_train = "/data/train.npz"     #   or a path already on the board
    # board_dataset = "datasets/digits"   #   or a folder on the board that grows (npz shards, or
                                          #   class folders of images); the job pins its files by sha256
    # board_format = "npz-shards"         #   npz-shards | image-folder
    # board_select = "new+replay"         #   all | new+replay (files the model in service never saw,
                                          #   plus older ones) | "v0003" (that version's exact files)
    # replay = 0.3                        #   new+replay: share of older samples in the mix
    eval = "data/digits/eval.npz"         # optional; evaluated on the board each epoch
    test = "data/digits/test.npz"         # host test set for before/after evaluation
    extra_tests = {clean = "data/digits/clean_test.npz"}   # optional named extra test sets
    feeds = {}                            # model input name -> npz key (default x, y)

    [detection]                           # optional, task = "embedded" only: the model is a
                                          # detector; the host also decodes, runs per-class NMS and
                                          # reports COCO mAP (map50, map, map75, per-class AP)
    classes = ["square", "disc"]          # object classes (class id 0 is the background)
    priors = "priors.npy"                 # optional [P, 4] center-form priors in [0, 1]; default:
                                          #   the model object's priors() at export
    scores_output = "scores"              # inference outputs: [N, P, C + 1] class probabilities
    offsets_output = "offsets"            #   and [N, P, 4] offsets (variances 0.1 / 0.2)
    score_threshold = 0.01
    iou_threshold = 0.45                  # per-class NMS
    max_detections = 100                  # per image
    # the test set also holds gt_boxes [N, M, 4] (x1 y1 x2 y2 in [0, 1]) and gt_labels [N, M]
    # (class index, -1 pads): tasks.detection.annotations.detection_arrays writes them

    [quantize]                            # optional: a static int8 QDQ model for the NPU
    calibration = "data/calib.npz"        # host set (x) the activation ranges are calibrated on
    method = "minmax"                     # minmax | entropy | percentile
    per_channel = true
    samples = 128                         # calibration samples used (the first ones)
    max_drop = 0.02                       # optional: promotion also needs the int8 model's
                                          #   promotion metric within max_drop of the float one

    [promotion]
    metric = "accuracy"                   # accuracy | loss | map50 | map (any metric the
                                          # evaluator reports); default accuracy for
                                          # classification/binary, map50 for detectors, else loss
    min_gain = 0.0                        # promote only if new - current > min_gain
                                          # (for "loss", lower is better: current - new > min_gain)
    significance = 0.05                   # the gain must also be significant at this level on
                                          #   the paired test set (McNemar for accuracy, paired
                                          #   bootstrap for losses); false: no test
    guardrails = {loss = 0.05, "clean.accuracy" = 0.02}   # "[set.]metric" = the regression each
                                          #   may show (absolute) against the reference
    rollout = true                        # install a promoted model on the board
                                          #   (models/<recipe>/current.onnx, see device_agent/README.md)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUILTIN_LOSSES = ("mse", "cross-entropy", "bce-with-logits", "l1")
STRATEGIES = ("classifier", "last-conv+classifier", "all", "freeze_net", "freeze_basenet")
BATCHNORM_MODES = ("frozen", "batch-stats")
PREFIX_CACHE = ("auto", "off")
CACHE_DTYPES = ("float32", "float16")
CACHE_STORES = ("auto", "ram", "disk")
OPTIMIZERS = ("adamw", "sgd")
TASKS = ("classification", "binary", "regression", "embedded")


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # torchvision | callable | onnx
    ref: str  # torchvision model name, "module:callable", or the ONNX path (absolute)
    input_shape: tuple[int, ...]
    num_classes: int | None = None
    weights: Path | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_names: tuple[str, ...] = ("input",)
    output_names: tuple[str, ...] = ("output",)
    cut_at: tuple[str, ...] = ()  # onnx models: tensors after which everything is dropped


@dataclass(frozen=True)
class TrainableSpec:
    strategy: str | None = None
    names: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    batchnorm: str = "frozen"  # one of BATCHNORM_MODES
    backbone: tuple[str, ...] = ()  # globs of the backbone's parameters (freeze_basenet)
    heads: tuple[str, ...] = ()  # globs of the heads' parameters (freeze_net)
    train_from: str | None = None  # node or tensor name: nothing before it trains


@dataclass(frozen=True)
class LossSpec:
    kind: str  # one of BUILTIN_LOSSES, "custom" or "embedded"
    factory: str | None = None  # "module:callable" for custom losses


@dataclass(frozen=True)
class OptimizerSpec:
    kind: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01


@dataclass(frozen=True)
class ScheduleSpec:
    warmup_steps: int = 0
    final_lr_ratio: float = 0.0


@dataclass(frozen=True)
class TrainingSpec:
    batch_size: int = 16
    epochs: int = 3
    checkpoint_every: int = 0
    log_every: int = 1
    seed: int = 0
    start_from: str = "base"  # "base": the recipe's weights; "current": the registry's model in service
    prefix_cache: str = "auto"  # one of PREFIX_CACHE: "auto" splits at the frozen prefix when it can
    cache_dtype: str = "float32"  # one of CACHE_DTYPES: how the board keeps the prefix's outputs
    cache_store: str = "auto"  # one of CACHE_STORES: RAM, the board's disk, or RAM when it fits


@dataclass(frozen=True)
class DataSpec:
    test: Path
    train: Path | None = None  # host file, uploaded
    board_train: str | None = None  # a path on the board instead
    eval: Path | None = None
    extra_tests: dict[str, Path] = field(default_factory=dict)
    make: str | None = None
    feeds: dict[str, str] = field(default_factory=dict)
    board_dataset: str | None = None  # a folder on the board that a board application appends to
    board_format: str = "npz-shards"  # npz-shards | image-folder
    board_select: str = "all"  # all | new+replay | a registry version ("v0003": its exact files)
    replay: float = 0.0  # new+replay: the share of older samples in the training set


@dataclass(frozen=True)
class HeadSpec:
    num_classes: int
    hidden: int = 0
    pool: str = "auto"  # auto | none
    seed: int = 0


QUANT_METHODS = ("minmax", "entropy", "percentile")


@dataclass(frozen=True)
class QuantizeSpec:
    calibration: Path
    method: str = "minmax"  # one of QUANT_METHODS
    per_channel: bool = True
    samples: int = 128
    max_drop: float | None = None


@dataclass(frozen=True)
class DetectionSpec:
    classes: tuple[str, ...]
    priors: Path | None = None  # None: the model's priors() at export
    scores_output: str = "scores"
    offsets_output: str = "offsets"
    score_threshold: float = 0.01
    iou_threshold: float = 0.45
    max_detections: int = 100


FLEET_STRATEGIES = ("fedavg", "fedavgm", "fedadam")


@dataclass(frozen=True)
class FleetSpec:
    """``[fleet]``: federated rounds over a group of boards (the fleet flow, deployment ``odl/fleet``)."""

    rounds: int = 3
    min_boards: int = 1  # quorum: fewer boards finishing a round fail the run
    deadline_s: float = 1800.0  # a board not done this long after its round started is cut
    strategy: str = "fedavg"  # one of FLEET_STRATEGIES
    server_lr: float = 1.0  # step on the aggregate: 1.0 = plain FedAvg
    momentum: float = 0.9  # fedavgm: server momentum; fedadam: beta1
    beta2: float = 0.99  # fedadam
    tau: float = 1e-3  # fedadam: adaptivity (the epsilon of Adam)


@dataclass(frozen=True)
class PromotionSpec:
    metric: str = "accuracy"
    min_gain: float = 0.0
    significance: float | None = 0.05  # alpha of the paired test of the gain; None: no test
    guardrails: dict[str, float] = field(default_factory=dict)  # "[set.]metric" -> tolerance
    rollout: bool = True  # install a promoted model on the board (models/<recipe>/current.onnx)


@dataclass(frozen=True)
class Recipe:
    name: str
    task: str
    source: Path  # the recipe file (or a synthetic path for inline recipes)
    model: ModelSpec
    trainable: TrainableSpec
    loss: LossSpec
    optimizer: OptimizerSpec
    schedule: ScheduleSpec
    training: TrainingSpec
    data: DataSpec
    promotion: PromotionSpec
    detection: DetectionSpec | None = None
    head: HeadSpec | None = None
    quantize: QuantizeSpec | None = None
    fleet: FleetSpec = field(default_factory=FleetSpec)
    raw: dict[str, Any] = field(default_factory=dict)  # the parsed TOML, for hashing and reports

    @property
    def base_dir(self) -> Path:
        """The folder relative paths and ``module:callable`` references resolve against."""
        return self.source.parent
