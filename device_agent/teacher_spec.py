"""``job.json``'s ``teacher``: an ONNX model the agent runs over the job's unlabeled shards before
training, and how its output becomes the student's labels (see :mod:`device_agent.teacher.labels`).

* ``labels = "hard"``: the teacher's top class, kept when its probability is at least
  ``threshold``; ``balance_cap`` > 0 keeps at most that many new samples per class (the most
  confident first);
* ``labels = "soft"``: the teacher's distribution at ``temperature`` (softmax of logits / T), the
  target of a distillation loss; ``threshold`` drops samples whose top probability is below it;
* ``labels = "boxes"``: a detector teacher (``output``: class scores ``[N, K, C + 1]``, background
  first; ``boxes_output``: corner boxes ``[N, K, 4]`` in [0, 1]); its detections after per-class
  NMS (``iou_threshold``) whose score is at least ``threshold`` are matched to the student's
  ``priors`` (a blob, ``[P, 4]`` center form) into per-prior classes (``target``) and offsets
  (``offsets_target``), as the host matches annotated boxes; an image without one is dropped.

``scores`` says what the teacher's output holds (``logits`` or ``probabilities``); ``input`` is
the shard array fed to the teacher's first input, ``target`` the array the labels stand in for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from device_agent.wire import BlobRef, SpecError, get_field, reject_unknown

LABEL_KINDS = ("hard", "soft", "boxes")
SCORE_KINDS = ("logits", "probabilities")


@dataclass(frozen=True)
class TeacherSpec:
    """The teacher model (a blob) and the rule that turns its outputs into labels."""

    model: BlobRef
    labels: str = "hard"
    scores: str = "logits"
    input: str = "x"
    target: str = "y"
    output: str = ""  # '' = the teacher's first output
    threshold: float = 0.0
    balance_cap: int = 0
    temperature: float = 1.0
    batch_size: int = 64
    num_classes: int = 0  # the classes the teacher's output must have (0: the student's)
    boxes_output: str = ""  # boxes: the teacher's corner boxes output
    offsets_target: str = "offsets"  # boxes: the array the matched offsets stand in for
    iou_threshold: float = 0.45  # boxes: the teacher's per-class NMS
    match_iou: float = 0.5  # boxes: a prior takes a box it overlaps this much
    max_boxes: int = 50  # boxes: detections kept per image (best first)
    priors: BlobRef | None = None  # boxes: the student's priors (.npy)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["model"] = self.model.to_dict()
        d["priors"] = self.priors.to_dict() if self.priors else None
        return d

    @property
    def key(self) -> str:
        """What the stored outputs depend on: the model and how it is fed and read (not the rule
        turning outputs into labels, which is applied when the dataset is opened)."""
        what = {"model": self.model.sha256, "input": self.input, "output": self.output, "scores": self.scores}
        if self.labels == "boxes":  # stored detections: after NMS
            what.update(boxes=self.boxes_output, iou=self.iou_threshold, max_boxes=self.max_boxes)
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, d: object, where: str = "teacher") -> TeacherSpec:
        if not isinstance(d, dict):
            raise SpecError(where, "an object with model, labels, scores, threshold ...", d)
        reject_unknown(d, {f.name for f in dataclasses.fields(cls)}, where)
        model = BlobRef.from_dict(d.get("model"), f"{where}.model")
        priors = BlobRef.from_dict(d["priors"], f"{where}.priors") if d.get("priors") is not None else None
        types = {"int": int, "float": (int, float), "str": str}
        vals = {f.name: get_field(d, f.name, types[str(f.type)], where, f.default)
                for f in dataclasses.fields(cls) if f.name not in ("model", "priors")}  # fmt: skip
        spec = cls(model, priors=priors, **vals)
        spec.check(where)
        return spec

    def check(self, where: str = "teacher") -> None:
        """Raise SpecError on values that make no sense."""
        if self.labels not in LABEL_KINDS:
            raise SpecError(f"{where}.labels", " or ".join(repr(k) for k in LABEL_KINDS), self.labels)
        if self.scores not in SCORE_KINDS:
            raise SpecError(f"{where}.scores", " or ".join(repr(k) for k in SCORE_KINDS), self.scores)
        if not 0.0 <= self.threshold <= 1.0:
            raise SpecError(f"{where}.threshold", "a probability in [0, 1]", self.threshold)
        if self.balance_cap < 0 or (self.balance_cap and self.labels != "hard"):
            raise SpecError(f"{where}.balance_cap", "an integer >= 0 (0 = no cap; hard labels only)",
                            self.balance_cap)  # fmt: skip
        if not 0.0 < self.temperature <= 100.0:
            raise SpecError(f"{where}.temperature", "a number in (0, 100]", self.temperature)
        if self.batch_size < 1:
            raise SpecError(f"{where}.batch_size", "an integer >= 1", self.batch_size)
        if self.num_classes < 0:
            raise SpecError(f"{where}.num_classes", "an integer >= 0", self.num_classes)
        for name in ("input", "target"):
            if not getattr(self, name):
                raise SpecError(f"{where}.{name}", "an npz array name", getattr(self, name))
        if self.labels == "boxes":
            if self.priors is None or not self.boxes_output or not self.offsets_target:
                raise SpecError(f"{where}.priors", "the student's priors, boxes_output and offsets_target "
                                "for labels = 'boxes'", self.priors)  # fmt: skip
            if not (0 < self.iou_threshold <= 1 and 0 < self.match_iou <= 1) or self.max_boxes < 1:
                raise SpecError(f"{where}.iou_threshold", "IoUs in (0, 1] and max_boxes >= 1",
                                [self.iou_threshold, self.match_iou, self.max_boxes])  # fmt: skip
