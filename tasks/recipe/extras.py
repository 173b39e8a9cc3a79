"""The tables a recipe may add around training: a new head on a cut ONNX model, int8 quantization,
detection, the fleet's rounds and the promotion rule (``[head]``, ``[quantize]``, ``[detection]``,
``[fleet]``, ``[promotion]``), each field's type, bounds, default and help written once; the
flows' fleet and promotion parameters reuse the shared types (``Rounds``, ``MinBoards``, ...)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, model_validator

from tasks.recipe.fields import Bool, FilePath, Int, Number, Text, Texts, recipe_table
from tasks.recipe.messages import Expect, expected
from tasks.recipe.privacy import PrivacySpec

QuantMethod = Literal["minmax", "entropy", "percentile"]
FleetStrategy = Literal[  # tasks.fleet.strategies.STRATEGIES' names
    "fedavg", "fedavgm", "fedadam", "median", "trimmed_mean", "krum", "bulyan"
]
QUANT_METHODS: tuple[str, ...] = get_args(QuantMethod)
FLEET_STRATEGIES: tuple[str, ...] = get_args(FleetStrategy)
MEAN_STRATEGIES = ("fedavg", "fedavgm", "fedadam")  # those that start from the mean of the updates
FleetMode = Literal["rounds", "buffered"]

MinGain = Annotated[
    Number,
    Field(
        ge=-(10**9),
        le=10**9,
        description="promote only if new - current > min_gain (for a loss, lower is better: "
        "current - new > min_gain)",
    ),
]
Rounds = Annotated[Int, Field(ge=1, le=1000, description="federated rounds")]
MinBoards = Annotated[
    Int, Field(ge=1, le=10000, description="quorum: a round with fewer boards finishing fails the run")
]
DeadlineS = Annotated[
    Number,
    Field(
        gt=0,
        le=7 * 86400,
        description="seconds: a board not done this long after its round started is cut (a straggler)",
    ),
]

BufferSize = Annotated[
    Int,
    Field(
        ge=1, le=10000, description="buffered: K, the arrivals each aggregation takes (at most the boards)"
    ),
]


def _distinct(classes: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(classes)) != len(classes):
        raise expected("a non-empty list of distinct object class names", got=list(classes))
    return classes


def _no_test(value: Any) -> Any:
    """``significance = "off"`` (or false): no significance test (None)."""
    if value is True:
        raise expected('a level in (0, 0.5], or "off"', got=value)
    return None if value is False or value == "off" else value


def _off(value: Any) -> Any:
    """``extra_tests_tolerance = "off"`` (or false): extra test sets are not guarded (None)."""
    if value is True:
        raise expected('a tolerance >= 0, or "off"', got=value)
    return None if value is False or value == "off" else value


@recipe_table("head")
class HeadSpec:
    """``[head]``: with one ``model.cut_at`` tensor, a new head on it."""

    num_classes: Int = Field(ge=1, le=100000, description="a Linear to num_classes outputs")
    hidden: Int = Field(0, ge=0, le=100000, description="> 0: a hidden Linear + ReLU of this width first")
    pool: Literal["auto", "none"] = Field(
        "auto", description="auto: global average pool + flatten a 4-D cut tensor | none: flatten only"
    )
    seed: Int = Field(0, ge=0, le=2**31 - 1, description="seeded initialisation (as torch.nn.Linear)")


@recipe_table("quantize")
class QuantizeSpec:
    """``[quantize]``: a static int8 QDQ model for the NPU."""

    calibration: FilePath = Field(description="host set (x) the activation ranges are calibrated on")
    method: QuantMethod = Field("minmax", description="minmax | entropy | percentile")
    per_channel: Bool = Field(True, description="per-channel weight scales")
    samples: Int = Field(128, ge=1, le=10**6, description="calibration samples used (the first ones)")
    max_drop: Annotated[Number, Field(ge=0)] | None = Field(
        None,
        description="promotion also needs the int8 model's promotion metric within max_drop of the float one",
    )


@recipe_table("detection")
class DetectionSpec:
    """``[detection]``, task embedded only: the model is a detector; the host decodes, runs per-class
    NMS and reports COCO mAP (the test set also holds gt_boxes [N, M, 4] and gt_labels [N, M])."""

    classes: Annotated[
        Texts,
        AfterValidator(_distinct),
        Expect("a non-empty list of distinct object class names"),
        WithJsonSchema(
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "uniqueItems": True}
        ),
    ] = Field(min_length=1, description="object class names (class id 0 is the background)")
    priors: FilePath | None = Field(
        None, description="[P, 4] center-form priors in [0, 1]; default: the model's priors() at export"
    )
    scores_output: str = Field("scores", description="inference output: [N, P, C + 1] class probabilities")
    scores: Literal["probabilities", "logits"] = Field(
        "probabilities",
        description="what scores_output holds: probabilities (checked: in [0, 1], rows summing to 1) | "
        "logits (the host applies a softmax over the classes)",
    )
    offsets_output: str = Field(
        "offsets", description="inference output: [N, P, 4] offsets (variances 0.1 / 0.2)"
    )
    score_threshold: Number = Field(0.01, ge=0, le=1, description="detections below are dropped")
    iou_threshold: Number = Field(0.45, gt=0, le=1, description="per-class NMS")
    max_detections: Int = Field(100, ge=1, le=10000, description="per image")


@recipe_table("fleet")
class FleetSpec:
    """``[fleet]``: federated rounds over a group of boards (the fleet flow, deployment ``odl/fleet``)."""

    rounds: Rounds = 3
    min_boards: MinBoards = 1
    deadline_s: DeadlineS = 1800.0
    strategy: FleetStrategy = Field(
        "fedavg",
        description="fedavg | fedavgm (server momentum) | fedadam | robust to bad boards: median | "
        "trimmed_mean | krum (multi-Krum) | bulyan",
    )
    server_lr: Number = Field(
        1.0, gt=0, le=100, description="step on the aggregate: 1.0 = plain FedAvg (default 0.03 for fedadam)"
    )
    momentum: Number = Field(0.9, ge=0, le=0.999999, description="fedavgm: server momentum; fedadam: beta1")
    beta2: Number = Field(0.99, ge=0, le=0.999999, description="fedadam")
    tau: Number = Field(1e-3, ge=1e-12, le=10, description="fedadam: adaptivity (Adam's epsilon)")
    trim_fraction: Number = Field(
        0.1, ge=0, lt=0.5, description="trimmed_mean: fraction of the boards dropped at each end, per weight"
    )
    byzantine: Int = Field(
        1,
        ge=0,
        le=1000,
        description="krum, bulyan: bad boards assumed (krum needs more than 2f + 2 "
        "boards, bulyan at least 4f + 3)",
    )
    krum_select: Int = Field(
        0, ge=0, le=10000, description="krum: updates kept and averaged (1: Krum; 0: boards - byzantine)"
    )
    privacy: PrivacySpec | None = Field(
        None, description="differential privacy: clipping, Gaussian noise, the ε budget ([fleet.privacy])"
    )
    mode: FleetMode = Field(
        "rounds",
        description="rounds: synchronous rounds (every board, then the aggregate) | buffered: asynchronous "
        "(FedBuff): every board trains continuously from the newest global model, which is aggregated "
        "every buffer_size arrivals; rounds then counts aggregations",
    )
    buffer_size: BufferSize = 2
    staleness_exponent: Number = Field(
        0.5,
        ge=0,
        le=10,
        description="buffered: an update started s global versions ago weighs (1 + s)^-a; 0.5 = FedBuff's "
        "1/sqrt(1 + s), 0 = not down-weighted",
    )

    @model_validator(mode="before")
    @classmethod
    def _adam_lr(cls, data: Any) -> Any:
        """A [fleet] table of fedadam without server_lr steps 0.03 (Adam's step size)."""
        if isinstance(data, dict) and data.get("strategy") == "fedadam" and "server_lr" not in data:
            return {**data, "server_lr": 0.03}
        return data

    @model_validator(mode="after")
    def _central_noise_on_a_mean(self) -> FleetSpec:
        """Central noise is calibrated to the mean of clipped updates: a mean strategy only."""
        if (
            self.privacy is not None
            and self.privacy.mode == "central"
            and self.strategy not in MEAN_STRATEGIES
        ):
            raise expected(
                f"one of {', '.join(MEAN_STRATEGIES)} with central privacy (its noise is calibrated to the "
                'mean of clipped updates), or privacy.mode = "local"',
                "strategy",
                self.strategy,
            )
        if self.privacy is not None and self.mode == "buffered":
            raise expected(
                '"rounds" with [fleet.privacy] (its accountant counts one release per board per round; '
                "buffered arrivals are not rounds), or no privacy table",
                "mode",
                self.mode,
            )
        return self


# an IoU or a tolerance of one, in [0, 1], or "off" (None)
UnitOrOff = Annotated[
    Annotated[Number, Field(ge=0, le=1)] | None,
    BeforeValidator(_off),
    WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"enum": [False, "off"]}]}),
    Expect('a number in [0, 1], or "off"'),
]


@recipe_table("promotion")
class PromotionSpec:
    """``[promotion]``: when a trained model replaces the one in service."""

    metric: Annotated[Text, Expect("a metric name such as 'accuracy' or 'loss'")] = Field(
        "accuracy",
        description="any metric the evaluator reports: accuracy | loss | map50 | map | miou | pixel_accuracy | "
        "...; default accuracy for classification/binary, map50 for detectors, miou for segmentation, else loss",
    )
    min_gain: MinGain = 0.0
    significance: Annotated[
        Annotated[Number, Field(gt=0, le=0.5)] | None,
        BeforeValidator(_no_test),
        WithJsonSchema(
            {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}, {"enum": [False, "off"]}]}
        ),
        Expect('a level in (0, 0.5], or "off"'),
    ] = Field(
        0.05,
        description="the gain must also be significant at this level on the paired test set (McNemar for "
        "accuracy, paired bootstrap over samples for losses, mse and mae, over images for mAP); a metric "
        'without a per-sample test is never promoted on unless "off": judged on min_gain alone, untested',
    )
    guardrails: Annotated[
        dict[str, Annotated[Number, Field(ge=0)]], Expect('a table of "[set.]metric" = tolerance >= 0')
    ] = Field(
        default_factory=dict,
        description='"[set.]metric" = the regression each may show (absolute) against the reference',
    )
    extra_tests_tolerance: Annotated[
        Annotated[Number, Field(ge=0)] | None,
        BeforeValidator(_off),
        WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0}, {"enum": [False, "off"]}]}),
        Expect('a tolerance >= 0, or "off"'),
    ] = Field(
        0.02,
        description="each [data] extra_tests set is guarded on the promotion metric (else its loss): it may "
        'regress by at most this much (absolute) unless a guardrail names the set; "off": not guarded',
    )
    class_tolerance: UnitOrOff = Field(
        0.02,
        description="segmentation: each object class's IoU may fall by at most this much (absolute) below "
        'the reference\'s, class by class; "off": not guarded',
    )
    min_class_iou: UnitOrOff = Field(
        0.05,
        description="segmentation: a candidate with an object class below this IoU does not find that class "
        'and is not promoted, whatever its mean; "off": no floor',
    )
    rollout: Bool = Field(
        True, description="install a promoted model on the board (models/<recipe>/current.onnx)"
    )
