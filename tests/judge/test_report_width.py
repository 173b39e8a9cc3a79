"""The run report fits a 1280 px wide window: no table is wider than the Prefect UI shows.

Measured in headless Chromium on the Prefect UI's artifact page at --window-size=1280,1000: the
markdown body is 699 px wide (the artifact's details take the right of the page), table cells do not
wrap (``white-space: nowrap``, 14 px Inter, 12 px padding), and what is wider is cut. The tables of
:func:`rich_report` measured 210-675 px, about 7 px per character of :func:`table_widths`' count
(the sum over columns of the longest cell, plus PAD_CHARS a column); before this change its gate
table was 708 px, its trend table 1076 px and its continual-learning table 852 px wide.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from tasks.judge.continual import night_rows
from tasks.judge.registry import Registry
from tasks.judge.report import ReportInput, render_report, step_losses
from tasks.judge.trend import trend_points
from tests.judge.test_verdict_lines import rejected_night

TABLE_CHARS = 100  # what a table may span, in table_widths' characters: 699 px at ~7 px each
PAD_CHARS = 3  # a cell's 2 x 12 px padding and its border, in characters


def _metrics(acc: float, loss: float, size: int) -> dict:
    return {"accuracy": acc, "loss": loss, "loss_kind": "cross-entropy", "latency_ms_batch1": 0.412,
            "latency_ms_per_sample": 0.0312, "model_size_bytes": size,
            "confusion_matrix": [[40, 2], [3, 39]],
            "per_class": {"precision": [0.93, 0.95], "recall": [0.95, 0.93]}}  # fmt: skip


def rich_report(tmp_path) -> ReportInput:
    """A nightly run's report with every section a classifier's report has: a rejected night with four
    failing checks, an int8 column, an extra test set, a trend and the continual table of 3 shards."""
    d = rejected_night()
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    reg = Registry(tmp_path / "registry")
    for night, acc in enumerate((0.80, 0.81, 0.8173)):
        shards = {f"shard-000{i + 1}": acc - 0.03 * (night - i) for i in range(night + 1)}
        metrics = {"accuracy": acc, "heldout": shards, "heldout_metric": "accuracy"}
        reg.record("digits_nightly", "vboard", model, metrics, d, info={"flow_run_id": f"fr-{night}"})
    versions = reg.versions("digits_nightly", "vboard")
    events = [SimpleNamespace(type="step", seq=i, data={"step": i, "loss": 2.0 / (i + 1)}) for i in range(20)]
    base, ref, cand = (
        _metrics(0.46, 1.7, 900_000),
        _metrics(0.8020, 0.3975, 905_000),
        _metrics(0.8173, 0.4725, 905_000),
    )
    return ReportInput(
        recipe="digits_nightly", board="vboard", flow_run_id="0f6c1f0e-5a3e-4d0c-9a51-6f0b2d7c9e11",
        job_id="digits_nightly-3f9a2c1b7d4e", test_set="data/digits/test.npz",
        evaluations={"base": base, "reference v0001": ref, "candidate": cand,
                     "candidate int8": _metrics(0.7513, 0.61, 240_000)},
        decision=d, version="v0003",
        extra_tests={"clean": {"base": {"accuracy": 0.99}, "candidate": {"accuracy": 0.835}}},
        history=[{"epoch": e, "train_loss": 1.0 / e, "eval_loss": 1.1 / e} for e in (1, 2, 3)],
        step_losses=step_losses(events),
        training={"steps": 39, "epochs_done": 3, "duration_s": 4.2, "train_loop_s": 2.1, "peak_rss_mb": 180.5},
        timings={"prepare data": 0.1, "export": 1.0, "generate artifacts": 3.2, "validate recipe": 2.2,
                 "deploy to vboard": 0.8, "train on vboard": 4.9, "retrieve": 0.4, "evaluate": 1.3, "promote": 0.2},
        trend=trend_points(versions, None),
        continual=night_rows(versions),
        lineage={"start_from": {"from": "v0001", "weights_sha256": "ab" * 32, "parameters": 12},
                 "board_data": {"path": "datasets/digits", "select": "new+replay", "files": [1, 2, 3],
                                "folder_files": 3, "samples": 600, "new": ["shard-0003.npz"],
                                "replayed": ["shard-0001.npz", "shard-0002.npz"]}},
    )  # fmt: skip


def _visible(cell: str) -> str:
    """A cell's text as rendered: images and link targets gone, emphasis and code marks dropped."""
    cell = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", cell)
    cell = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell)
    return cell.replace("**", "").replace("`", "").strip()


def table_widths(md: str) -> list[tuple[int, str]]:
    """(width in characters, header line) of each markdown table in ``md``."""
    tables, rows = [], []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([_visible(c) for c in line.strip().strip("|").split("|")])
        elif rows:
            body = [r for r in rows if not all(set(c) <= set("-: ") for c in r)]
            widths = [max(len(r[i]) if i < len(r) else 0 for r in body) for i in range(len(body[0]))]
            tables.append((sum(widths) + PAD_CHARS * len(widths), "|".join(body[0])))
            rows = []
    return tables


def test_every_table_of_a_full_report_fits_1280_px(tmp_path):
    md = render_report(rich_report(tmp_path))
    tables = table_widths(md)
    assert len(tables) >= 6, tables  # gate, trend, continual, before/after, extra set, per class, stages
    wide = [(w, head) for w, head in tables if w > TABLE_CHARS]
    assert not wide, wide


def test_the_measure_sees_a_wide_table():
    """The check can fail: the gate table as it was (the whole sentence in the figures column)."""
    sentence = "accuracy 0.8173 vs 0.8020 (v0001): gain +0.0152 beats the required +0.0000, p = 0.125 >= 0.05"
    md = f"| gate check | verdict | figures |\n|---|---|---|\n| significance | 🔴 **fails** | {sentence} |\n"
    assert table_widths(md)[0][0] > TABLE_CHARS
