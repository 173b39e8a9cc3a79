"""The host reads and writes the autograd runtime's checkpoints as it does ORT's (warm starts and
fleet rounds): every trainable tensor replaced, read back exactly, no optimizer state; a tensor
missing, extra or of another shape is one ArtifactError line."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from device_agent.runtimes.state import CheckpointState
from tasks.checkpoint import autograd_checkpoint, checkpoint_weights, write_checkpoint
from tasks.errors import ArtifactError

BASE = {"conv.weight": np.ones((2, 1, 3, 3), np.float32), "fc.bias": np.zeros(3, np.float32)}


def _base(folder):
    path = folder / "checkpoint.npz"
    np.savez(path, **BASE)  # the prepared checkpoint: name -> tensor
    return path


@settings(max_examples=25, deadline=None)
@given(
    st.tuples(
        *(hnp.arrays(np.float32, a.shape, elements=st.floats(-1e3, 1e3, width=32)) for a in BASE.values())
    )
)
def test_a_written_checkpoint_holds_the_new_weights(tmp_path_factory, values):
    folder = tmp_path_factory.mktemp("ckpt")
    weights = dict(zip(BASE, values, strict=True))
    out = write_checkpoint(_base(folder), weights, folder / "warm" / "checkpoint", every=True)
    assert autograd_checkpoint(out)
    back = checkpoint_weights(out, trainable_only=True)
    assert back.keys() == weights.keys() and all(np.array_equal(back[n], w) for n, w in weights.items())
    state = CheckpointState.load_checkpoint(out)
    assert state.optimizer["step"] == 0 and state.optimizer["m"] == {}  # a fresh optimizer


@pytest.mark.parametrize(
    ("weights", "words"),
    [
        ({"conv.weight": BASE["conv.weight"]}, "'fc.bias' (float32[3]) is absent"),
        ({**BASE, "fc.bias": np.zeros(4, np.float32)}, "'fc.bias' (float32[3]) is float32[4]"),
        ({**BASE, "extra": np.zeros(1, np.float32)}, "the new weights hold 'extra'"),
    ],
)
def test_weights_that_do_not_fit_are_refused_in_one_line(tmp_path, weights, words):
    with pytest.raises(ArtifactError) as info:
        write_checkpoint(_base(tmp_path), weights, tmp_path / "out")
    assert words in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_the_agent_reads_an_autograd_job_s_checkpoint_without_the_training_api(tmp_path):
    from device_agent.runtimes import checkpoint_state

    state = CheckpointState(dict(BASE), properties={"step": 7})
    CheckpointState.save_checkpoint(state, tmp_path / "ckpt-00000007")
    back = checkpoint_state("autograd").load_checkpoint(str(tmp_path / "ckpt-00000007"))
    assert back.properties == {"step": 7} and np.array_equal(back.parameters["fc.bias"].data, BASE["fc.bias"])


def test_boards_of_a_round_write_the_same_checkpoint_at_once(tmp_path):
    """A fleet round's board tasks (threads of one process) write the same suffix checkpoint from the
    same global weights at once: each write succeeds and the file holds the weights (one shared
    temporary name made one board of 16 fail with FileNotFoundError)."""
    from concurrent.futures import ThreadPoolExecutor

    base, out = _base(tmp_path), tmp_path / "round" / "global.ckpt.suffix"
    weights = {n: a + 1 for n, a in BASE.items()}
    with ThreadPoolExecutor(16) as pool:
        done = list(pool.map(lambda _: write_checkpoint(base, weights, out, every=True), range(64)))
    assert done == [out] * 64 and sorted(p.name for p in out.parent.iterdir()) == [out.name]
    assert all(np.array_equal(checkpoint_weights(out)[n], w) for n, w in weights.items())
