"""The training loop: ORT Module/Optimizer, linear LR schedule, per-epoch eval, checkpoints.

Everything a step depends on is a function of the step number or stored in the checkpoint
(weights, optimizer state, running sums), so a resumed job reproduces an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from device_agent.checkpoints import Progress, save_checkpoint
from device_agent.data import InputSpec, epoch_permutation, steps_per_epoch
from device_agent.errors import AgentError
from device_agent.events import EventLog
from device_agent.jobdir import JobDir
from device_agent.ort import seed_runtime
from device_agent.protocol import ExitCode, JobSpec, TrainParams

log = logging.getLogger(__name__)
CANCEL_POLL_S = 0.2  # how often the loop looks for cancel.request (SIGTERM is seen at once)
STEP_DELAY_ENV = "ODL_AGENT_STEP_DELAY_S"  # slows every step down (tests and demos of live progress)


def lr_at(step: int, total: int, p: TrainParams) -> float:
    """Linear warm-up to ``p.lr`` over ``warmup_steps``, then linear decay to ``lr*final_lr_ratio``."""
    if step < p.warmup_steps:
        return p.lr * (step + 1) / p.warmup_steps
    span = max(1, total - p.warmup_steps - 1)
    frac = min(1.0, (step - p.warmup_steps) / span)
    return p.lr * (1.0 - frac * (1.0 - p.final_lr_ratio))


@dataclass
class Session:
    """The live ORT objects of one job."""

    api: Any
    state: Any
    module: Any
    optimizer: Any
    inputs: list[InputSpec]


class Cancelled(Exception):
    """Raised inside the loop when a cancel request is seen at a step boundary."""


class Trainer:
    """Runs the steps of one job from ``progress`` to the end, emitting events."""

    def __init__(
        self, job: JobDir, spec: JobSpec, sess: Session, train_ds: Any, eval_ds: Any, events: EventLog
    ):
        self.job, self.spec, self.sess, self.events = job, spec, sess, events
        self.train_ds, self.eval_ds = train_ds, eval_ds
        p = spec.train
        self.spe = steps_per_epoch(len(train_ds), p.batch_size, p.drop_last)
        full = self.spe * p.epochs
        self.total = min(full, p.max_steps) if p.max_steps else full
        self.delay = float(os.environ.get(STEP_DELAY_ENV) or 0)
        self.cancel_flag = False
        self._perm: tuple[int, np.ndarray] | None = None
        self._cancel_path = str(job.cancel_file)
        self._cancel_polled = 0.0

    def train(self, progress: Progress) -> Progress:
        """Train until ``self.total`` steps; raises Cancelled or AgentError(DIVERGED)."""
        self.sess.module.train()
        while progress.step < self.total:
            self._check_cancel(progress)
            epoch_start = progress.epoch * self.spe
            if progress.step >= epoch_start + self.spe:
                self._end_epoch(progress)
                continue
            perm = self._permutation(progress.epoch)
            pos = progress.step - epoch_start
            self._step(
                progress, perm[pos * self.spec.train.batch_size : (pos + 1) * self.spec.train.batch_size]
            )
            at_epoch_end = progress.step == epoch_start + self.spe or progress.step == self.total
            if at_epoch_end:
                self._end_epoch(progress)
            elif self.spec.train.checkpoint_every and progress.step % self.spec.train.checkpoint_every == 0:
                self.checkpoint(progress)
        return progress

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(self.spec.train.seed, epoch, len(self.train_ds)))
        return self._perm[1]

    def _step(self, progress: Progress, idx: np.ndarray) -> None:
        batch = self._feed(self.train_ds.take(idx))
        lr = lr_at(progress.step, self.total, self.spec.train)
        seed_runtime(self.spec.train.seed * 1_000_003 + progress.step)
        t0 = time.perf_counter()
        self.sess.optimizer.set_learning_rate(lr)
        outs = self.sess.module(*batch)
        loss = _scalar(outs)
        if not math.isfinite(loss):
            raise AgentError(
                ExitCode.DIVERGED, f"loss became {loss} at step {progress.step + 1} (lr {lr:.3g})"
            )
        self.sess.optimizer.step()
        self.sess.module.lazy_reset_grad()
        dt = time.perf_counter() - t0
        progress.train_loop_s += dt
        progress.step += 1
        progress.batches += 1
        progress.loss_sum += loss * len(idx)
        progress.seen += len(idx)
        progress.correct += self._correct(outs, batch)
        if progress.step % self.spec.train.log_every == 0 or progress.step == self.total:
            self.events.emit("step", step=progress.step, epoch=progress.epoch, loss=loss, lr=lr,
                             samples_per_s=round(len(idx) / dt, 2) if dt > 0 else 0.0)  # fmt: skip
        if self.delay:
            time.sleep(self.delay)

    def _feed(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.ascontiguousarray(arrays[s.name], dtype=s.dtype) for s in self.sess.inputs]

    def _correct(self, outs: Any, batch: list[np.ndarray]) -> int:
        if self.spec.task not in ("classification", "binary") or not isinstance(outs, tuple) or len(outs) < 2:
            return 0
        logits, labels = np.asarray(outs[1]), batch[1]
        if self.spec.task == "classification":
            return int((logits.argmax(axis=-1) == labels.reshape(-1)).sum())
        return int(((logits.reshape(-1) > 0) == (labels.reshape(-1) > 0.5)).sum())

    def _has_accuracy(self) -> bool:
        return self.spec.task in ("classification", "binary") and len(self.sess.module.output_names()) > 1

    def _end_epoch(self, progress: Progress) -> None:
        row: dict[str, float] = {"epoch": progress.epoch + 1, "step": progress.step}
        row["train_loss"] = progress.loss_sum / max(1, progress.seen)
        if self._has_accuracy():
            row["train_accuracy"] = progress.correct / max(1, progress.seen)
        if self.eval_ds is not None:
            row.update(self.evaluate())
            self.events.emit("eval", **row)
        progress.history.append(row)
        progress.epoch += 1
        progress.reset_epoch()
        self.events.emit("epoch", **row)
        self.checkpoint(progress)

    def evaluate(self) -> dict[str, float]:
        """Loss (and accuracy) of the eval set, in order, in eval mode."""
        module, bs = self.sess.module, self.spec.train.batch_size
        module.eval()
        loss_sum, correct, n = 0.0, 0, len(self.eval_ds)
        for start in range(0, n, bs):
            batch = self._feed(self.eval_ds.take(np.arange(start, min(n, start + bs))))
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
        path = save_checkpoint(self.sess.api, self.sess.state, self.job.checkpoints, progress)
        self.events.emit(
            "checkpoint", step=progress.step, epoch=progress.epoch, path=str(path.relative_to(self.job.path))
        )

    def _check_cancel(self, progress: Progress) -> None:
        now = time.monotonic()
        if now - self._cancel_polled >= CANCEL_POLL_S:  # a stat per step costs more than a small step
            self._cancel_polled = now
            self.cancel_flag = self.cancel_flag or os.path.exists(self._cancel_path)
        if self.cancel_flag:
            self.checkpoint(progress)
            raise Cancelled(f"cancelled at step {progress.step}")


def _scalar(outs: Any) -> float:
    first = outs[0] if isinstance(outs, tuple | list) else outs
    return float(first.reshape(-1)[0]) if getattr(first, "ndim", 0) else float(first)
