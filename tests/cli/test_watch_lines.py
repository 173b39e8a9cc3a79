"""``odl watch``'s training line reads the board's events as the flow logs them: steps, epochs and
the loss, and one line when a teacher has labelled the board's unlabeled samples."""

from __future__ import annotations

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
