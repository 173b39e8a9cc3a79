"""In-process units: LR schedule, shuffle, event log, checkpoints, job spec builder, board venv."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from device_agent.data.readers import epoch_permutation, load_npz_arrays
from device_agent.job.events import EventLog, read_events
from device_agent.job.schedule import lr_at
from device_agent.protocol import JobSpec, TrainParams, file_sha256
from tasks.errors import ArtifactError, RecipeError


def test_lr_schedule_warmup_then_linear_decay():
    p = TrainParams(batch_size=1, epochs=1, lr=1.0, warmup_steps=4, final_lr_ratio=0.1)
    lrs = [lr_at(s, 14, p) for s in range(14)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0 and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))
    assert lr_at(0, 10, TrainParams(batch_size=1, epochs=1, lr=0.5)) == 0.5


def test_shuffle_depends_on_seed_and_epoch_only():
    a, b = epoch_permutation(7, 3, 100), epoch_permutation(7, 3, 100)
    assert np.array_equal(a, b) and sorted(a) == list(range(100))
    assert not np.array_equal(a, epoch_permutation(7, 4, 100))
    assert not np.array_equal(a, epoch_permutation(8, 3, 100))


def test_npz_memory_mapped_when_stored(tmp_path):
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.savez(tmp_path / "plain.npz", x=x, y=np.arange(6))
    np.savez_compressed(tmp_path / "packed.npz", x=x)
    plain, packed = (
        load_npz_arrays(tmp_path / "plain.npz", "d"),
        load_npz_arrays(tmp_path / "packed.npz", "d"),
    )
    assert isinstance(plain["x"].base, np.memmap) and np.array_equal(plain["x"], x)
    assert np.array_equal(plain["y"], np.arange(6)) and np.array_equal(packed["x"], x)


def test_event_log_cuts_torn_line_and_continues_seq(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path, "j")
    log.emit("started", total_steps=3)
    log.emit("step", step=1, loss=0.5)
    log.close()
    with open(path, "a") as fh:
        fh.write('{"protocol_version": 2, "type": "step", "seq": 2, "da')  # a write cut by a power loss
    log = EventLog(path, "j")
    log.emit("step", step=2, loss=0.4)
    log.close()
    events = read_events(path)
    assert [e["seq"] for e in events] == [0, 1, 2] and events[-1]["data"]["step"] == 2
    assert path.read_text().endswith("\n")


def test_build_job_spec_maps_recipe_and_manifest(digits_recipe, prepared_digits):
    from tasks.prepare.board_job import build_job_spec

    spec, files = build_job_spec(digits_recipe, prepared_digits, "unit-1", max_steps=7)
    assert JobSpec.from_json(spec.to_json()) == spec
    t = spec.train
    assert (t.batch_size, t.epochs, t.lr, t.max_steps) == (32, 10, 1e-3, 7)
    assert (t.final_lr_ratio, t.log_every, t.seed) == (0.1, 5, 0)
    assert spec.task == "classification" and spec.num_classes == 10 and spec.output_names == ("logits",)
    assert spec.memory_estimate_mb == prepared_digits.validation["board_peak_estimate_mb"] > 0
    for key, ref in spec.artifacts.items():
        assert file_sha256(files[ref.sha256]) == ref.sha256 and files[ref.sha256].name in (
            "training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"), key  # fmt: skip
    assert files[spec.train_data.blob.sha256] == digits_recipe.data.train
    assert spec.eval_data.blob.sha256 == file_sha256(digits_recipe.data.eval)
    assert spec.feeds == {"input": "x", "labels": "y"} or set(spec.feeds.values()) == {"x", "y"}


def test_build_job_spec_errors(digits_recipe, prepared_digits):
    from dataclasses import replace

    from tasks.prepare.board_job import build_job_spec

    with pytest.raises(RecipeError, match="job_id"):
        build_job_spec(digits_recipe, prepared_digits, "../evil")
    for manifest in (
        {**prepared_digits.manifest, "files": {}, "prefix_cache": {"enabled": False}},
        {**prepared_digits.manifest, "prefix_cache": {"enabled": True, "files": {}}},
    ):
        with pytest.raises(ArtifactError, match="files.training_model"):
            build_job_spec(digits_recipe, replace(prepared_digits, manifest=manifest), "ok")
    with pytest.raises(RecipeError, match="training.batch_size"):  # the recipe itself refuses it now
        bad = replace(digits_recipe, training=replace(digits_recipe.training, batch_size=0))
        build_job_spec(bad, prepared_digits, "ok")


def test_board_venv_is_readable_and_reused(board_python):
    from tasks.vboard.venv import STAMP_NAME, ensure_board_venv

    venv = board_python.parent.parent
    before = (venv / STAMP_NAME).stat().st_mtime_ns
    assert ensure_board_venv(venv) == board_python
    assert (venv / STAMP_NAME).stat().st_mtime_ns == before, "unchanged requirements must not rebuild"
    assert stat.S_IMODE(os.stat(venv / "lib").st_mode) == 0o755
    site = next((venv / "lib").glob("python3*/site-packages"))
    dists = sorted(p.name.split("-")[0].lower() for p in site.glob("*.dist-info"))
    assert [d for d in dists if d not in ("pip", "setuptools")] == ["numpy", "onnxruntime_training_cpu"]


def test_readme_lists_every_exit_code():
    from device_agent.protocol import EXIT_HELP, ExitCode
    from tasks.paths import PROJECT_ROOT

    readme = (PROJECT_ROOT / "device_agent" / "README.md").read_text()
    for code, text in EXIT_HELP.items():
        assert f"| {int(code)} | `{ExitCode(code).name}` | {text} |" in readme
