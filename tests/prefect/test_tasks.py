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
