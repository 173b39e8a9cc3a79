"""What keeps a thousand boards' round linear (issue 55), each at the size where it matters: the
streamed mean and figures against the all-in-memory ones (generated updates), the one-line summary
of a thousand boards left out, the waves a round's boards are split into, and one mailbox query a
tick however many jobs a process follows. The round itself, on real agents, is
``bench/fleet_scale.py`` (its ``--quick`` runs in tests/bench/test_bench.py)."""

from __future__ import annotations

import sqlite3
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.fleet.outliers import SAMPLE, streamed_figures, update_figures
from tasks.fleet.rounds import left_out
from tasks.fleet.strategies import weighted_mean
from tasks.fleet.strategies.base import streamed_mean
from tasks.fleet.waves import WAVES, label, run_parts, waves


@st.composite
def rounds_of_updates(draw: st.DrawFn) -> tuple[dict, list, list[int]]:
    n = draw(st.integers(1, 12))
    shapes = draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3)), min_size=1, max_size=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    g = {f"t{i}": rng.normal(size=s).astype(np.float32) for i, s in enumerate(shapes)}
    ups = [
        {k: (v + scale * rng.normal(size=v.shape)).astype(np.float32) for k, v in g.items()} for _ in range(n)
    ]
    samples = draw(st.lists(st.integers(1, 500), min_size=n, max_size=n))
    return g, ups, samples


@settings(max_examples=40, deadline=None)
@given(rounds_of_updates())
def test_the_streamed_mean_and_figures_are_the_in_memory_ones_to_the_bit(case):
    g, ups, samples = case
    mean = weighted_mean(list(zip(ups, samples, strict=True)))
    streamed = streamed_mean(ups.__getitem__, len(ups), samples)
    assert all(np.array_equal(mean[k], streamed[k]) and mean[k].dtype == streamed[k].dtype for k in mean)
    assert streamed_figures(g, ups.__getitem__, len(ups), mean) == update_figures(g, ups, mean)


def test_past_the_sample_the_median_reference_holds_a_bounded_number_of_updates():
    """1 000 updates, one of them sign-flipped and large: it is the one flagged, while the figures
    read each update twice and keep only the sample's deltas."""
    rng = np.random.default_rng(0)
    g = {"w": np.zeros(50, np.float32)}
    direction = rng.normal(size=50)
    ups = [{"w": (direction + 0.3 * rng.normal(size=50)).astype(np.float32)} for _ in range(1000)]
    ups[517] = {"w": (-20 * direction).astype(np.float32)}
    reads = []

    def load(i: int) -> dict:
        reads.append(i)
        return ups[i]

    figs = streamed_figures(g, load, len(ups), weighted_mean([(u, 1) for u in ups]))
    assert [i for i, f in enumerate(figs) if f["outlier"]] == [517]
    assert set(figs[517]["kinds"]) == {"norm", "direction"}
    assert len(reads) == 2000 and SAMPLE < 1000


def test_a_thousand_boards_left_out_are_summed_up_in_one_short_line():
    boards = {f"b{i:04d}": {"status": "ok"} for i in range(1000)}
    for i in range(0, 1000, 2):
        boards[f"b{i:04d}"] = {
            "status": "late",
            "error": "Straggler: board b: job j was running at the round's deadline",
        }
    boards["b0001"] = {"status": "rejected", "error": "board b0001: tensor 'w' holds NaN or inf"}
    line = left_out(boards)
    assert "\n" not in line and len(line) < 600, line
    assert line.startswith(
        "500 late (b0000, b0002, b0004 and 497 more): Straggler: board b: job j was running"
    )
    assert "1 rejected (b0001): board b0001: tensor 'w' holds NaN or inf" in line


def test_a_rounds_boards_are_at_most_sixteen_waves_all_running_at_once():
    class B:
        def __init__(self, name: str) -> None:
            self.name = name

    boards = [B(f"b{i:04d}") for i in range(1000)]
    parts = waves(boards)
    assert len(parts) == WAVES and sum(map(len, parts)) == 1000 and {len(p) for p in parts} == {62, 63}
    assert [b.name for p in parts for b in p] == [b.name for b in boards]
    assert label(parts[0]) == "b0000..b0062 (63)" and label([boards[5]]) == "b0005 (1)"
    started = threading.Barrier(63, timeout=10)  # every part of a wave under way together

    def part(name: str) -> str:
        started.wait()
        if name == "b0013":
            raise ValueError("no update")
        return name.upper()

    got = run_parts([b.name for b in parts[0]], part)
    assert got["b0000"] == "B0000" and isinstance(got["b0013"], ValueError)


def test_a_process_following_many_pull_jobs_reads_the_mailbox_once_a_tick(tmp_path):
    """200 runs' threads follow 200 jobs of one mailbox: the watch reads them all in one query a
    tick, and each thread wakes when its own job moves."""
    from tasks.board.pull.mailbox import Mailbox
    from tasks.board.pull.watch import READ_S, JobWatch

    mailbox = Mailbox(tmp_path)
    for i in range(200):
        mailbox.invite(f"b{i}")
        mailbox.submit(f"b{i}", {"kind": "train", "id": f"job-{i}"}, {}, time.time() + 600)
    calls = []
    real = mailbox.marks

    def counted(ids: list[str]) -> dict:
        calls.append(len(ids))
        return real(ids)

    mailbox.marks = counted  # type: ignore[method-assign]
    watch = JobWatch(mailbox)
    seen: dict[str, tuple] = {}

    def follow(i: int) -> None:
        known = None
        while known is None or known[0] != "cancelled":
            known = watch.wait(f"job-{i}", known, 5) or known
        seen[f"job-{i}"] = known

    threads = [threading.Thread(target=follow, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    time.sleep(3 * READ_S)
    for i in range(200):
        mailbox.stop(f"job-{i}")  # never fetched: cancelled at once
    for t in threads:
        t.join(10)
    assert len(seen) == 200 and all(m[0] == "cancelled" for m in seen.values())
    assert max(calls) == 200 and len(calls) <= 20, calls  # ~2 a second, for all of them


def test_a_failed_mailbox_transaction_leaves_the_threads_kept_connection_clean(tmp_path):
    """Each thread keeps its SQLite connection to the mailbox: a transaction that fails is rolled
    back, and the next one on the same connection starts clean and commits."""
    from tasks.board.pull.mailbox import Mailbox

    mailbox = Mailbox(tmp_path)
    with pytest.raises(sqlite3.IntegrityError), mailbox.tx() as db:
        db.execute("INSERT INTO boards (name, state, since) VALUES ('b1', 'invited', 1)")
        db.execute("INSERT INTO boards (name, state) VALUES ('b2', 'invited')")  # since is NOT NULL
    assert mailbox.board("b1") is None  # the first insert went with the failed transaction
    mailbox.invite("b1")
    assert mailbox.board("b1").state == "invited"
