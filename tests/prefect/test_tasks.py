"""Retry policy and cache keys of the Prefect tasks (no server needed)."""

from __future__ import annotations

from prefect.states import Completed, Failed

from tasks.errors import DeviceUnreachable, RecipeError, TrainingFailed, TransferError
from tasks.prefect.tasks import retry_if_retryable


def test_only_retryable_errors_are_retried():
    def verdict(exc):
        return retry_if_retryable(None, None, Failed(data=exc))

    assert verdict(DeviceUnreachable("link down")) and verdict(TransferError("hash mismatch"))
    assert not verdict(TrainingFailed("diverged")) and not verdict(
        RecipeError("training.epochs", "an integer >= 1")
    )
    assert not verdict(ValueError("bug")) and not retry_if_retryable(None, None, Completed(data=1))


def test_cached_steps_key_on_the_inputs_and_refresh_when_the_output_is_gone(
    tmp_path, monkeypatch, digits_recipe
):
    from tasks import stages
    from tasks.prefect import tasks as pt

    monkeypatch.setenv("ODL_HOME", str(tmp_path))
    stages.prepare_data(digits_recipe)
    inp = stages.inputs(digits_recipe)
    assert pt.export.cache_policy.cache_key_fn(None, {"inp": inp}) == f"export-{inp.key}"
    calls = []
    monkeypatch.setattr(type(pt.export), "with_options", lambda self, **kw: calls.append(kw) or (lambda i: i))
    pt.prepare_step("export", inp)
    stages.export(inp)
    pt.prepare_step("export", inp)
    (inp.folder / ".done-export").unlink()
    pt.prepare_step("export", inp)
    assert [c["refresh_cache"] for c in calls] == [True, False, True]


def test_the_prepare_steps_of_a_run_build_the_model_once(tmp_path, monkeypatch):
    """Export, artifacts and validation, each its own task, are one preparation: the model's
    BatchNorm statistics are measured once (each task measured them again: three times a run)."""
    from tasks import stages
    from tasks.prefect import tasks as pt
    from tasks.prepare.export import bn_calibration
    from tests.prepare.kit import tiny_recipe

    monkeypatch.setenv("ODL_HOME", str(tmp_path / "home"))
    recipe = tiny_recipe(
        tmp_path, {"trainable": {"batchnorm_calibration": 16}, "training": {"runtime": "autograd"}}
    )
    stages.prepare_data(recipe)
    inp, measured, measure = stages.inputs(recipe), [], bn_calibration.measure
    monkeypatch.setattr(bn_calibration, "measure", lambda *args: measured.append(args) or measure(*args))
    monkeypatch.setattr(type(pt.export), "with_options", lambda self, **kw: self.fn)  # the tasks' own code,
    monkeypatch.setattr(pt, "said", lambda line, t0: None)  # outside a run (no run logger)
    assert list(pt.prepare_steps(inp)) == ["export", "generate artifacts", "validate recipe"]
    assert all(stages.step_done(inp, step) for step in ("export", "artifacts", "validate"))
    assert len(measured) == 1
