"""The training loop: ORT Module/Optimizer, linear LR schedule, per-epoch eval, checkpoints.

Everything a step depends on is a function of the step number or stored in the checkpoint
(weights, optimizer state, running sums), so a resumed job reproduces an uninterrupted one.

A step does only what it must between ORT calls (measured in issue 15: right after an ORT step
every Python or numpy call runs several times slower than in isolation, its caches evicted):
ORT's random generators are re-seeded only when the training graph has a random op; the
learning rate is set only when it changes; one ``take`` gathers the rows of up to
``PENDING_STEPS`` steps (at most ``CHUNK_BYTES``), which each step slices; the training accuracy
of up to ``PENDING_STEPS`` steps is counted at once, at the latest before a checkpoint or the
end of an epoch. The loss is read and checked at every step, so a divergence still stops the
step it happens at. Before each step (and each eval batch) its step, epoch and dataset indices are
marked in ``JOBDIR/batch`` with one ``pwrite`` (:mod:`device_agent.job.batch_mark`): a process that
dies of a signal is then reported with them by its supervisor.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from device_agent.data.readers import InputSpec, epoch_permutation, steps_per_epoch
from device_agent.errors import AgentError
from device_agent.job.accuracy import correct_of, count_correct
from device_agent.job.batch_mark import BatchMarker
from device_agent.job.checkpoints import Progress, save_checkpoint
from device_agent.job.events import EventLog
from device_agent.job.hold import Hold
from device_agent.job.jobdir import JobDir
from device_agent.job.schedule import lr_at
from device_agent.keypoints_spec import KeypointsScoring
from device_agent.protocol import ExitCode, JobSpec

log = logging.getLogger(__name__)
CANCEL_POLL_S = 0.2  # how often the loop looks for cancel.request (SIGTERM is seen at once)
STEP_DELAY_ENV = "ODL_AGENT_STEP_DELAY_S"  # slows every step down (tests and demos of live progress)
ACCURACY_TASKS = ("classification", "binary", "segmentation", "keypoints")  # pixel accuracy, PCK
PENDING_STEPS = 64  # steps whose logits and labels are kept before their accuracy is counted
PENDING_VALUES = 1 << 16  # ... fewer when a step's logits are large (at most ~256 KB of float32)
CHUNK_BYTES = 1 << 20  # the rows of the next steps gathered at once, up to PENDING_STEPS steps


@dataclass
class Session:
    """The live ORT objects of one job."""

    api: Any
    state: Any
    module: Any
    optimizer: Any
    inputs: list[InputSpec]
    seeder: Any = None  # called with the step's seed before each step when a step draws random numbers


class Cancelled(Exception):
    """Raised inside the loop when a cancel request is seen at a step boundary."""


class Trainer:
    """Runs the steps of one job from ``progress`` to the end, emitting events.

    Datasets must return fresh arrays from ``take`` (not a reused buffer): the labels of the
    last steps are kept until their accuracy is counted.
    """

    def __init__(self, job: JobDir, spec: JobSpec, sess: Session, train_ds: Any, eval_ds: Any, events: EventLog,
                 marker: BatchMarker) -> None:  # fmt: skip
        self.job, self.spec, self.sess, self.events, self.marker = job, spec, sess, events, marker
        self.train_ds, self.eval_ds = train_ds, eval_ds
        p = self.params = spec.train
        self.spe = steps_per_epoch(len(train_ds), p.batch_size, p.drop_last)
        full = self.spe * p.epochs
        self.total = min(full, p.max_steps) if p.max_steps else full
        self.delay = float(os.environ.get(STEP_DELAY_ENV) or 0)
        self.cancel_flag = False
        self._perm: tuple[int, np.ndarray] | None = None
        self._cancel_path = str(job.cancel_file)
        self._hold = Hold(job.hold_file, job.held_file)  # a test hook, read with cancel.request
        self._cancel_polled = 0.0
        self._feeds = [(s.name, s.dtype) for s in sess.inputs]
        self._seeder = sess.seeder
        self._lr: float | None = None  # the rate last given to the optimizer
        self._counts_accuracy = spec.task in ACCURACY_TASKS
        self._input_hw = tuple(sess.inputs[0].shape[-2:])  # keypoints: the pixels labels are given in
        self._scoring = spec.keypoints or KeypointsScoring()  # keypoints: the recipe's PCK
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []  # (logits, labels) not counted yet
        self._pending_cap = PENDING_STEPS
        self._chunk_steps, self._chunk_sized = 1, False  # steps whose rows one take gathers

    def train(self, progress: Progress) -> Progress:
        """Train until ``self.total`` steps; raises Cancelled or AgentError(DIVERGED)."""
        self.sess.module.train()
        while progress.step < self.total:
            self._check_cancel(progress)
            epoch_start = progress.epoch * self.spe
            if progress.step >= epoch_start + self.spe:
                self._end_epoch(progress)
                continue
            self._run_epoch(progress, epoch_start)
        return progress

    def _run_epoch(self, progress: Progress, epoch_start: int) -> None:
        """The remaining steps of the epoch, its end; between steps the checkpoints and cancel polls."""
        perm = self._permutation(progress.epoch)
        bs, every = self.params.batch_size, self.params.checkpoint_every
        end = min(epoch_start + self.spe, self.total)
        stop = min(len(perm), (end - epoch_start) * bs)  # the epoch's last row to train on
        chunk: list[np.ndarray] = []
        first = last = 0  # the rows [first, last) of ``perm`` that ``chunk`` holds
        while True:
            start = (progress.step - epoch_start) * bs
            if min(start + bs, stop) > last:
                first, last = start, min(stop, start + self._chunk_steps * bs)
                chunk = self._gather(perm[first:last])
            self.marker.mark(
                "train", progress.step + 1, progress.epoch + 1, perm[start : min(start + bs, last)]
            )
            self._step(progress, [a[start - first : start - first + bs] for a in chunk])
            if self._hold.due(progress.step):
                self._hold.wait(progress.step, self._cancel_requested)
            if progress.step == end:
                self._end_epoch(progress)
                return
            if every and progress.step % every == 0:
                self.checkpoint(progress)
            if self.cancel_flag or time.monotonic() - self._cancel_polled >= CANCEL_POLL_S:
                self._check_cancel(progress)

    def _gather(self, idx: np.ndarray) -> list[np.ndarray]:
        """The rows ``idx`` of every model input, in input order, of the input's dtype.

        The first call, of one step, sizes the next ones: as many steps as fit ``CHUNK_BYTES`` (a
        gather and conversion per chunk, which a step then only slices).
        """
        chunk = self._feed(self.train_ds.take(idx))
        if not self._chunk_sized:
            step_bytes = sum(a.nbytes for a in chunk) / max(1, len(idx)) * self.params.batch_size
            self._chunk_steps = int(max(1, min(PENDING_STEPS, CHUNK_BYTES // max(1.0, step_bytes))))
            self._chunk_sized = True
        return chunk

    def _feed(self, rows: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The model's inputs, in order and of its dtypes, from a dataset's ``take``."""
        return [np.ascontiguousarray(rows[name], dtype=dtype) for name, dtype in self._feeds]

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(self.params.seed, epoch, len(self.train_ds)))
        return self._perm[1]

    def _step(self, progress: Progress, batch: list[np.ndarray]) -> None:
        step, n = progress.step, len(batch[0])
        lr = lr_at(step, self.total, self.params)
        if self._seeder is not None:
            self._seeder((self.params.seed * 1_000_003 + step) & 0x7FFFFFFF)
        module, optimizer = self.sess.module, self.sess.optimizer
        t0 = time.perf_counter()
        if lr != self._lr:
            optimizer.set_learning_rate(lr)
            self._lr = lr
        outs = module(*batch)
        loss = _scalar(outs)
        if not math.isfinite(loss):
            raise AgentError(ExitCode.DIVERGED, f"loss became {loss} at step {step + 1} (lr {lr:.3g})")
        optimizer.step()
        module.lazy_reset_grad()
        dt = time.perf_counter() - t0
        progress.train_loop_s += dt
        progress.step = step = step + 1
        progress.batches += 1
        progress.loss_sum += loss * n
        progress.seen += n
        if self._counts_accuracy and isinstance(outs, tuple) and len(outs) > 1:
            self._keep_for_accuracy(progress, outs[1], batch[1])
        if step % self.params.log_every == 0 or step == self.total:
            self.events.emit("step", step=step, epoch=progress.epoch, loss=loss, lr=lr,
                             samples_per_s=round(n / dt, 2) if dt > 0 else 0.0)  # fmt: skip
        if self.delay:
            time.sleep(self.delay)

    def _keep_for_accuracy(self, progress: Progress, logits: np.ndarray, labels: np.ndarray) -> None:
        if not self._pending:
            self._pending_cap = max(1, min(PENDING_STEPS, PENDING_VALUES // max(1, logits.size)))
        self._pending.append((logits, labels))
        if len(self._pending) >= self._pending_cap:
            self._count_pending(progress)

    def _count_pending(self, progress: Progress) -> None:
        """Add the correct predictions of the kept steps to ``progress.correct``."""
        if self._pending:
            progress.correct += count_correct(
                self.spec.task, self._pending, self.spec.ignore_index, self._input_hw, self._scoring
            )
            self._pending.clear()

    def _correct(self, outs: Any, batch: list[np.ndarray]) -> int:
        if self.spec.task not in ACCURACY_TASKS or not isinstance(outs, tuple) or len(outs) < 2:
            return 0
        spec, hw = self.spec, self._input_hw
        return correct_of(spec.task, np.asarray(outs[1]), batch[1], spec.ignore_index, hw, self._scoring)

    def _has_accuracy(self) -> bool:
        return self.spec.task in ACCURACY_TASKS and len(self.sess.module.output_names()) > 1

    def _end_epoch(self, progress: Progress) -> None:
        self._count_pending(progress)
        row: dict[str, float] = {"epoch": progress.epoch + 1, "step": progress.step}
        row["train_loss"] = progress.loss_sum / max(1, progress.seen)
        if self._has_accuracy():
            row["train_accuracy"] = progress.correct / max(1, progress.seen)
        if self.eval_ds is not None:
            row.update(self.evaluate(progress))
            self.events.emit("eval", **row)
        progress.history.append(row)
        progress.epoch += 1
        progress.reset_epoch()
        self.events.emit("epoch", **row)
        self.checkpoint(progress)

    def evaluate(self, progress: Progress) -> dict[str, float]:
        """Loss (and accuracy) of the eval set, in order, in eval mode (at the end of ``progress``'s epoch)."""
        module, bs = self.sess.module, self.params.batch_size
        module.eval()
        loss_sum, correct, n = 0.0, 0, len(self.eval_ds)
        for start in range(0, n, bs):
            rows = np.arange(start, min(n, start + bs))
            self.marker.mark("eval", progress.step, progress.epoch + 1, rows)
            batch = self._feed(self.eval_ds.take(rows))
            outs = module(*batch)
            loss_sum += _scalar(outs) * len(batch[0])
            correct += self._correct(outs, batch)
        module.train()
        out = {"eval_loss": loss_sum / max(1, n)}
        if self._has_accuracy():
            out["eval_accuracy"] = correct / max(1, n)
        return out

    def checkpoint(self, progress: Progress) -> None:
        """Save a resumable checkpoint and emit a 'checkpoint' event."""
        self._count_pending(progress)
        path = save_checkpoint(self.sess.api, self.sess.state, self.job.checkpoints, progress)
        self.events.emit(
            "checkpoint", step=progress.step, epoch=progress.epoch, path=str(path.relative_to(self.job.path))
        )

    def _check_cancel(self, progress: Progress) -> None:
        now = time.monotonic()
        if now - self._cancel_polled >= CANCEL_POLL_S:  # a stat per step costs more than a small step
            self._cancel_polled = now
            self.cancel_flag = self.cancel_flag or os.path.exists(self._cancel_path)
            self._hold.poll()
        if self.cancel_flag:
            self.checkpoint(progress)
            raise Cancelled(f"cancelled at step {progress.step}")

    def _cancel_requested(self) -> bool:
        """A cancel seen now (used while the job is held)."""
        self.cancel_flag = self.cancel_flag or os.path.exists(self._cancel_path)
        return self.cancel_flag


def _scalar(outs: Any) -> float:
    first = outs[0] if isinstance(outs, tuple | list) else outs
    return float(first.reshape(-1)[0]) if getattr(first, "ndim", 0) else float(first)
