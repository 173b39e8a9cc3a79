"""Retry policy and cache inputs of the Prefect tasks (no server needed)."""

from __future__ import annotations

from prefect.states import Completed, Failed

from tasks.errors import DeviceUnreachable, RecipeError, TrainingFailed, TransferError
from tasks.prefect.tasks import input_hashes, retry_if_retryable


def test_only_retryable_errors_are_retried():
    def verdict(exc):
        return retry_if_retryable(None, None, Failed(data=exc))

    assert verdict(DeviceUnreachable("link down")) and verdict(TransferError("hash mismatch"))
    assert not verdict(TrainingFailed("diverged")) and not verdict(
        RecipeError("training.epochs", "an integer >= 1")
    )
    assert not verdict(ValueError("bug")) and not retry_if_retryable(None, None, Completed(data=1))


def test_input_hashes_cover_recipe_data_and_model_source(digits_recipe):
    from tasks.recipe.datafiles import ensure_datasets

    ensure_datasets(digits_recipe)
    hashes = input_hashes(digits_recipe)
    assert {
        "recipe",
        "data.train",
        "data.test",
        "data.extra_tests.clean",
        "model.weights",
        "model.callable",
    } <= set(hashes)
    assert all(len(h) == 64 for h in hashes.values())
