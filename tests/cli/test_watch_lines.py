"""``odl watch``'s training line reads the board's events as the flow logs them: steps, epochs and
the loss, and one line when a teacher has labelled the board's unlabeled samples."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from flows.cli.watch import _Progress


def test_the_watch_line_follows_labelling_and_training(capsys):
    p = _Progress(live=False)
    p.feed("board vboard: labels shard=shard-0001.npz done=64 total=250")
    assert capsys.readouterr().out == ""  # labelling under way: nothing yet
    p.feed("board vboard: labels shard=shard-0001.npz done=250 total=250")
    assert capsys.readouterr().out == "  teacher: labelled 250 unlabeled samples on the board\n"
    p.feed("board vboard: started total_steps=80 steps_per_epoch=8")
    p.feed("board vboard: epoch epoch=5 step=40 train_loss=0.5")
    p.show()
    out = capsys.readouterr().out
    assert out.startswith("  training: step 40/80 (50 %), epoch 5, loss 0.5")


def _task(name: str, start: float, end: float, state: str = "Completed"):
    t0 = datetime(2026, 11, 26, tzinfo=UTC)
    final = SimpleNamespace(name=state, is_final=lambda: True, is_completed=lambda: state == "Completed")
    return SimpleNamespace(id=name, name=name, state=final, start_time=t0 + timedelta(seconds=start),
                           expected_start_time=None, end_time=t0 + timedelta(seconds=end),
                           total_run_time=timedelta(seconds=end - start))  # fmt: skip


def _log(i: int, at: float, message: str):
    return SimpleNamespace(
        id=i, message=message, timestamp=datetime(2026, 11, 26, tzinfo=UTC) + timedelta(seconds=at)
    )


def test_a_stage_waits_for_its_late_log_lines_and_training_never_shows_after_it(capsys):
    """The worker sends log lines in batches: the board's last epochs, logged while it trained, are
    read after the training stage and the next ones have finished. Each stage's line waits for the
    logs to reach its end (or LOG_LAG_S), so the training's last figures come before its line and
    no training line comes after it (the bar at 130/130 after 'ok promote')."""
    from flows.cli.watch import LOG_LAG_S, _Stages

    train, retrieve = _task("train on vboard", 0, 10), _task("retrieve from vboard", 10, 11)
    promote = _task("promote", 11, 12)
    early = [_log(1, 0.5, "board vboard: started total_steps=130 steps_per_epoch=13"),
             _log(2, 5, "board vboard: epoch epoch=5 step=65 train_loss=0.5")]  # fmt: skip
    stages = _Stages(_Progress(live=False))
    stages.poll([train, retrieve, promote], early, now=100.0)  # all three done, logs only up to 5 s
    assert capsys.readouterr().out == ""  # nothing is due: the logs have not reached the end of training
    late = [*early, _log(3, 9.9, "board vboard: epoch epoch=10 step=130 train_loss=0.2"),
            _log(4, 11.5, "Finished in state Completed()")]  # fmt: skip
    stages.poll([train, retrieve, promote], late, now=101.0)
    stages.progress.show()
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["  training: step 130/130 (100 %), epoch 10, loss 0.2", "  ok   train on vboard 10.0 s",
                     "  ok   retrieve from vboard 1.0 s"], lines  # fmt: skip
    stages.poll([train, retrieve, promote], late, now=101.0 + LOG_LAG_S)  # no later log line: the lag's end
    assert capsys.readouterr().out == "  ok   promote 1.0 s\n"
    for progress in (stages.progress, _Progress(live=True)):
        progress.feed("board vboard: started total_steps=130 steps_per_epoch=13")
        progress.feed("board vboard: epoch epoch=10 step=130 train_loss=0.2")
        progress.trained = True
        progress.show()
    assert capsys.readouterr().out == ""  # once its stage is printed, the training line never returns
