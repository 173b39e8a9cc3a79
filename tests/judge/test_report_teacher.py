"""The report's teacher section renders what the board reported, for class and detector teachers."""

from __future__ import annotations

from tasks.judge.report_teacher import teacher_md

HIST = {"edges": [round(i / 10, 1) for i in range(11)], "counts": [0, 0, 0, 1, 3, 10, 7, 17, 14, 448]}


def test_a_class_teacher_section():
    figures = {"teacher_samples": 500, "kept": 448, "dropped_threshold": 52, "dropped_cap": 0, "threshold": 0.9,
               "mean_confidence": 0.965, "shards_labelled": 1, "samples": 250, "samples_per_s": 248.0,
               "teacher_peak_rss_mb": 68.0, "shards_reused": 1, "confidence_histogram": HIST,
               "class_counts": {"1": 35, "0": 39, "10": 2}}  # fmt: skip
    md = "\n".join(teacher_md(figures, {"samples": 500, "files": ["a", "b"], "new_samples": 250}))
    assert "unlabeled on the board for this run: 500 samples in 2 shard(s), 250 new" in md
    assert (
        "trained on: **448** of 500 (90%); dropped under the threshold 0.9: 52, by the per-class cap: 0" in md
    )
    assert "248 samples/s, peak RSS 68 MB); stored labels reused: 1 shard(s)" in md
    assert (
        "### Teacher confidence (top-class probability)" in md
        and "| 0.9-1.0 | 448 | " + "█" * 20 + " |" in md
    )
    classes = md.split("### Classes")[1]
    assert (
        classes.index("| 0 | 39 |") < classes.index("| 1 | 35 |") < classes.index("| 10 | 2 |")
    )  # numeric order


def test_a_detector_teacher_section_and_none_without_a_teacher():
    figures = {"teacher_samples": 256, "kept": 215, "boxes": 370, "boxes_per_image": 1.72, "threshold": 0.3,
               "confidence_histogram": HIST, "class_counts": {"0": 100}}  # fmt: skip
    md = "\n".join(teacher_md(figures, None))
    assert "images trained on: **215** of 256 (84%) (the others had no detection scoring 0.3 or more)" in md
    assert "370 boxes, 1.72 per image" in md and "### Teacher confidence (each detection's score)" in md
    assert teacher_md({}, {"samples": 3}) == []
