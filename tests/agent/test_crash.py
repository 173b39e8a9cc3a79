"""A training process that dies of a signal (issue 53): its supervisor writes a failed result in one
line naming the signal, the step, the epoch and the batch's samples (exit CRASHED, resumed from its
last checkpoint); a death at the same step as the one before is deterministic (CRASHED_AGAIN) and
never runs again. A real SIGFPE of ONNX Runtime (an int64 division by a count of positive labels
that one batch of the board's data leaves at 0), and real kills of the child by the test."""

from __future__ import annotations

import os
import signal

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from device_agent.data.readers import epoch_permutation
from device_agent.job.batch_mark import BatchMark, BatchMarker, read_mark
from device_agent.job.events import read_events
from device_agent.protocol import NEVER_RETRY, ExitCode
from tests.prepare.crash_kit import EMPTY_BOARD_STEP

SIGFPE_WORDS = "SIGFPE (an arithmetic fault: an integer division or remainder by zero)"


def _ended(agent_board, job_id: str) -> dict:
    return agent_board.wait(job_id, lambda s: s["state"] not in ("running", "pending"), timeout=120)


def _failed(jdir) -> list[dict]:
    return [e["data"] for e in read_events(jdir / "events.jsonl") if e["type"] == "failed"]


def test_a_sigfpe_of_onnx_runtime_is_one_line_then_dying_at_the_same_step_again_is_never_retried(
    agent_board, crash_job
):
    spec, files = crash_job("sigfpe")
    jdir = agent_board.install(spec, files)
    with np.load(files[spec.train_data.blob.sha256]) as npz:
        positive = (npz["y"] > 0).any(axis=1)
    rows = epoch_permutation(spec.train.seed, 1, len(positive))[(EMPTY_BOARD_STEP - 5) * 16 :][:16]
    assert not positive[rows].any()
    samples = f"samples [{', '.join(map(str, rows))}] of train_data (16 in the batch)"

    assert agent_board.run("start", str(jdir)).code == 0
    status = _ended(agent_board, "sigfpe")
    assert (status["state"], status["exit_code"]) == ("failed", ExitCode.CRASHED), status
    first = status["last_event"]["data"]
    where = f"at step {EMPTY_BOARD_STEP} of 8 (epoch 2), training on {samples}"
    kept = f"its last checkpoint (step 4) is kept in {jdir / 'checkpoints' / 'ckpt-00000004'}"
    assert first["error"] == (
        f"the training process died of {SIGFPE_WORDS} {where}; {kept}: a new start resumes from it, and a death "
        "at the same step again is not retried"
    )
    assert first["signal"] == "SIGFPE" and first["batch"]["rows"] == rows.tolist() and first["step"] == 4

    assert agent_board.run("start", str(jdir)).code == 0  # a first death resumes: from step 4, to die at 7
    status = _ended(agent_board, "sigfpe")
    assert (status["state"], status["exit_code"]) == ("failed", ExitCode.CRASHED_AGAIN), status
    error = status["last_event"]["data"]["error"]
    assert error.startswith(f"the training process died of {SIGFPE_WORDS} {where}, as the time before: that "
                            "batch kills it every time; not retried: check those samples"), error  # fmt: skip
    assert "\n" not in error and ExitCode.CRASHED_AGAIN in NEVER_RETRY
    starts = [e["data"] for e in read_events(jdir / "events.jsonl") if e["type"] == "started"]
    assert [s["resumed_from_step"] for s in starts] == [None, 4]

    size = (jdir / "events.jsonl").stat().st_size
    assert agent_board.run("start", str(jdir)).code == 0  # asked again: the stored outcome stays
    assert _ended(agent_board, "sigfpe")["exit_code"] == ExitCode.CRASHED_AGAIN
    again = agent_board.run("run", str(jdir))
    assert again.code == ExitCode.CRASHED_AGAIN and again.last["error"] == error
    assert (jdir / "events.jsonl").stat().st_size == size, "a deterministic death must not train again"


def _kill_child_at(agent_board, job_id: str, jdir, step: int, signum: int) -> dict:
    """Start the job paused after ``step`` (the hold hook), kill its training process (the ``run``
    child of the supervisor, whose pid its last 'started' event gives) by ``signum``; its status once
    it has ended."""
    agent_board.release(job_id)
    agent_board.hold(job_id, step)
    assert agent_board.run("start", str(jdir)).code == 0
    assert agent_board.held_at(job_id) == step
    pid = [e["data"]["pid"] for e in read_events(jdir / "events.jsonl") if e["type"] == "started"][-1]
    os.kill(pid, signum)
    return _ended(agent_board, job_id)


def test_deaths_at_other_steps_are_resumed_and_the_job_finishes(agent_board, digits_job):
    """The bookkeeping: killed by the test at step 3, then at step 5 (another place: not
    deterministic), the job resumes each time; its marks name the board's rows of those steps. A
    SIGKILL that no out-of-memory count explains is another process's."""
    spec, files = digits_job("killed", epochs=1, checkpoint_every=2)
    jdir = agent_board.install(spec, files)
    perm = epoch_permutation(spec.train.seed, 0, 400)
    deaths = ((3, 2, signal.SIGSEGV, "SIGSEGV (an invalid memory access)"),
              (5, 4, signal.SIGKILL, "SIGKILL (killed by another process, or by an out-of-memory killer"))  # fmt: skip
    for step, kept, signum, words in deaths:
        status = _kill_child_at(agent_board, "killed", jdir, step, signum)
        assert (status["state"], status["exit_code"]) == ("failed", ExitCode.CRASHED), status
        data = _failed(jdir)[-1]
        assert data["batch"]["rows"] == perm[(step - 1) * 32 : step * 32].tolist() and data["step"] == kept
        shown = ", ".join(map(str, perm[(step - 1) * 32 :][:16]))
        assert data["error"].startswith(f"the training process died of {words}"), data["error"]
        assert (
            f" at step {step} of 13 (epoch 1), training on samples [{shown}, ...] of train_data (32 in the "
            f"batch); its last checkpoint (step {kept}) is kept" in data["error"]
        ), data["error"]
    agent_board.release("killed")
    assert agent_board.run("start", str(jdir)).code == 0
    status = _ended(agent_board, "killed")
    assert status["state"] == "finished", status
    assert [d["exit_code"] for d in _failed(jdir)] == [ExitCode.CRASHED] * 2


_MARKS = st.lists(
    st.tuples(
        st.sampled_from(["open", "train", "eval", "finish"]),
        st.integers(0, 2**40),
        st.integers(0, 999),
        st.lists(st.integers(0, 2**40), max_size=80),
        st.booleans(),
    ),  # fmt: skip
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(_MARKS, st.integers(1, 70))
@example([("train", 12, 2, list(range(100, 132)), True), ("eval", 13, 2, [0, 1, 2], False)], 4)
def test_the_last_mark_reads_back_whole_over_longer_ones(tmp_path_factory, marks, keep):
    """Each mark overwrites the file from its start, a shorter over a longer one: the reader sees
    the last one, its rows cut at ``keep``, whether they came as a numpy array or a list."""
    path = tmp_path_factory.mktemp("mark") / "batch"
    marker = BatchMarker(path, keep=keep)
    for phase, step, epoch, rows, as_array in marks:
        marker.mark(phase, step, epoch, np.array(rows, np.int64) if as_array else rows)
    marker.close()
    phase, step, epoch, rows, _ = marks[-1]
    got = read_mark(path)
    assert got == BatchMark(phase, step, epoch, len(rows), tuple(rows[:keep]))
    assert got.same_place(BatchMark(phase, step, epoch, 0, ())) and not got.same_place(None)
    assert BatchMark.from_dict(got.to_dict()) == got
    assert read_mark(path.with_name("none")) is None
