"""Detection without labels on the board, end to end (issue 26): two nights of unlabeled shapes
images; a larger detector labels them on the board (its boxes matched to the student's priors by
the agent), the SSD-Lite student trains on them through odl/full, the gate judges mAP@0.5 with its
bootstrap interval, and the report shows the teacher's figures and the detections drawn."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flow.teacher_nights import unlabeled_nights

pytestmark = pytest.mark.slow

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "ssdlite_teacher_small.toml"
DATASET = "datasets/shapes-unlabeled-small"


def test_a_detector_teacher_labels_unlabeled_images_on_the_board(prefect_harness, flow_home, flow_board):
    nights = unlabeled_nights(flow_board, RECIPE, DATASET)
    (out0, v0, report0), (out1, v1, report1) = nights
    teacher, base = out0.metrics["teacher"], out0.metrics["base"]
    # the teacher knows more than the pretrained student (0.11 against 0.014 here)
    assert teacher["map50"] > base["map50"] + 0.03
    assert v0.info["board_data"]["unlabeled"]["new_samples"] == 128
    for out, version, report in nights:
        sig = version.info["decision"]["significance"]
        assert sig["test"].startswith("paired bootstrap over 64 test images")
        assert out.promoted == (sig["low"] > 0 and version.info["decision"]["gain"] > 0), version.info[
            "reason"
        ]
        assert "## Teacher labels (on the board)" in report and "matched to the student's priors" in report
        assert "boxes," in report and "per image" in report
        assert "### Teacher confidence (each detection's score)" in report
        assert "![test image 0](data:image/png" in report  # the candidate's boxes drawn on test images
    assert v1.info["board_data"]["replayed"] == ["shard-0001.npz"] or not out0.promoted
    # the student learns from the teacher's boxes alone: its loss on the annotated test set falls
    # (5 epochs a night: 6.69 -> 5.80 after one night, 5.56 after two: a margin no rounding crosses),
    # while its mAP@0.5 with this weak CI-sized teacher (0.11) moves near the bootstrap's noise (0.014 ->
    # 0.029, not significant, then 0.049 with [+0.006, +0.070]), so whether that gain is significant is
    # the gate's to say, not a threshold's (the reference's 0.33 teacher lifts the student from 0.021 to
    # 0.134, promoted with [+0.063, +0.166]: `make teacher-detection`)
    assert out1.metrics["candidate"]["loss"] < 0.95 * base["loss"], [v.info["reason"] for _, v, _ in nights]
