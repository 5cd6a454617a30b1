"""Where a rank's step time goes: the loop's laps, summed over a window of steps and reported once per window.

Every step is cut into laps with ``time.perf_counter`` (a few clock reads: cheap beside a step):
batch preparation, forward + backward compute, the backward's wait for the gradient all-reduce,
the optimiser (clipping + Adam), and handing the step's metric row over (to the store in one
process, to the event stream on a worker). Every :data:`WINDOW_STEPS` steps the window's means go out in
one metric row, with ``step_s``, the wall time of the window divided by its steps (validation and
snapshots left out), measured apart from the laps: the parts add up to it when nothing is missed.

**The wait, and who it waited for.** DDP all-reduces gradients in buckets while backward still runs; a
hook on each parameter (``register_post_accumulate_grad_hook``, on the training thread) notes when the
*last* local gradient is ready and DDP hands its bucket over, which is when this rank's backward compute
ended. DDP's own C++ all-reduce is left as it is: a Python communication hook would run its future
callback on gloo's thread, taking the GIL from the training thread every step, which cost throughput
(see the README's benchmark section). ``loss.backward()`` returns once every bucket is reduced, so what
follows the hand-over is the wait compute did not hide. It holds the transfer itself and the time spent
waiting for a slower rank to hand over its gradient. The slowest rank of a step waits only for the
transfer, so per step ``min over ranks of the wait`` is the exposed all-reduce and the rest of each
rank's wait is idle. The minimum comes free: the ranks' stop agreement (an all-reduce every
``AGREE_EVERY_STEPS`` steps, :class:`petmodel.train.TrainLoop`) carries the negated waits of the steps
since the last one, and its MAX is their per-step minimum. The agreement itself is timed and reported
per step (``agree_s``).

**On a GPU** kernels run asynchronously, so a lap means something only after a synchronisation:
there, only one step per window is timed (synchronising at its laps) and stands for the window's
parts; ``step_s`` is still the whole window's.

**The gradient noise scale** (McCandlish et al. 2018) needs the squared norm of a small-batch and of a
large-batch gradient: once per window the hooks sum the squares of this rank's own gradient (batch
b, before the all-reduce: ``grad_sq``) and clipping gives the averaged one (batch N·b:
``grad_sq_global``). :mod:`petmodel.step_breakdown` turns the rows into the breakdown and the noise scale.

``PETMODEL_STEP_TIMING=0`` (or false/no/off: :func:`~petmodel.settings.env_flag`) in a worker's environment
turns the recording off (no laps, no hooks, no window rows): what ``benchmarks.bench_step_timing`` compares against to price it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from petmodel.settings import env_flag

WINDOW_STEPS = 16  # steps per reported window (a multiple of the agreement interval, 8)
AGREE_SLOTS = 8  # per-step waits carried by one stop agreement: its interval (petmodel.train.AGREE_EVERY_STEPS)
UNTIMED = -1e9  # a slot with no wait measured (negated, so it never wins the MAX)
# The columns a window's row adds (petmodel.store.schema stores them); seconds per step, this rank's
# names in the window's steps on average, and the noise scale's squared norms.
WINDOW_FIELDS = ("step_s", "data_s", "compute_s", "allreduce_s", "idle_s", "optimizer_s", "report_s", "agree_s",
                 "rank_batch", "grad_sq", "grad_sq_global")
_LAPS = ("data_s", "compute_s", "wait_s", "optimizer_s", "report_s")


class StepTimer:
    """The laps of each step and the window they add up in, for one :class:`~petmodel.train.TrainLoop`.

    Per step: :meth:`begin`, :meth:`lap` at each boundary, :meth:`after_backward`, :meth:`end`. In DDP
    the stop agreement calls :meth:`agreement_waits` for what to send and :meth:`agreed` with what came
    back; a window closes there (every :data:`WINDOW_STEPS` steps), in one process at :meth:`end`.
    :meth:`take_window` hands a closed window's fields to the next metric row.
    """

    def __init__(self, ddp: torch.nn.parallel.DistributedDataParallel | None, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.ddp = ddp is not None
        self.timing = False  # this step's laps are being taken
        self.noise_step = False  # this step also sums the local gradient's squares
        self.t = 0.0
        self.step_laps: dict[str, float] = {}
        self.last_handover: float | None = None  # when the last local gradient was ready (its bucket handed over)
        self.local_sq: float | torch.Tensor = 0.0
        self.waits = [UNTIMED] * AGREE_SLOTS  # negated waits of the steps since the last agreement
        self.window_start: float | None = None  # set when the first step of this call is done (it warms up)
        self._reset_window()
        self.closed: dict[str, Any] = {}
        self.enabled = env_flag("PETMODEL_STEP_TIMING", True)
        if ddp is not None and self.enabled:
            for param in ddp.module.parameters():
                if param.requires_grad:
                    param.register_post_accumulate_grad_hook(self._grad_ready)

    def _reset_window(self) -> None:
        self.sums = dict.fromkeys((*_LAPS, "allreduce_s", "idle_s", "agree_s"), 0.0)
        self.timed_steps = self.window_steps = self.batch_sum = 0
        self.excluded = 0.0  # seconds of validation and snapshots in the window
        self.noise: tuple[float, float] | None = None

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()  # only on the timed step: the kernels queued so far belong to the lap
        return time.perf_counter()

    def _grad_ready(self, param: torch.Tensor) -> None:
        """A parameter's local gradient is accumulated; DDP's own hook hands it to its bucket's all-reduce
        next, so the last of a step is when this rank's backward compute ended. On the noise step its
        squares add to this rank's own norm (before the average). Cheap: a clock read on the timed steps."""
        if self.timing:
            self.last_handover = time.perf_counter()
            if self.noise_step and param.grad is not None:
                self.local_sq = self.local_sq + param.grad.detach().float().pow(2).sum()

    # ---- one step
    def begin(self, step: int) -> None:
        """Step ``step`` (from 1) starts now."""
        in_window = self.enabled and self.window_start is not None
        self.noise_step = in_window and step % WINDOW_STEPS == WINDOW_STEPS // 2
        self.timing = in_window and (not self.cuda or self.noise_step)
        if self.timing:
            self.step_laps, self.last_handover, self.local_sq = {}, None, 0.0
            self.t = self._now()

    def lap(self, name: str) -> None:
        """The part called ``name`` ends now (and the next one begins)."""
        if self.timing:
            now = self._now()
            self.step_laps[name] = self.step_laps.get(name, 0.0) + now - self.t
            self.t = now

    def after_backward(self) -> None:
        """``loss.backward()`` returned: compute ran until the last bucket's hand-over, then it waited."""
        if not self.timing:
            return
        now = self._now()
        handover = self.t if self.last_handover is None else min(max(self.last_handover, self.t), now)
        if not self.ddp:
            handover = now
        self.step_laps["compute_s"] = self.step_laps.get("compute_s", 0.0) + handover - self.t
        self.step_laps["wait_s"] = now - handover
        self.t = now

    def end(self, step: int, *, rank_batch: int, grad_norm: torch.Tensor | None) -> None:
        """Step ``step`` is done (its optimiser step too)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.window_start is None:  # the first step of this call: warms caches and allocators, not counted
            self.window_start = now
            return
        self.window_steps += 1
        self.batch_sum += rank_batch
        if self.timing:
            self.timing = False
            self.timed_steps += 1
            for name in _LAPS:
                self.sums[name] += self.step_laps.get(name, 0.0)
            self.waits[(step - 1) % AGREE_SLOTS] = -self.step_laps.get("wait_s", 0.0)
            if self.noise_step and self.ddp and grad_norm is not None:
                self.noise = (float(self.local_sq), float(grad_norm) ** 2)
        if not self.ddp and step % WINDOW_STEPS == 0:
            self.sums["idle_s"], self.sums["allreduce_s"] = 0.0, self.sums["wait_s"]  # one rank: nobody to wait for
            self._close(now)

    # ---- between steps
    def exclude(self, seconds: float) -> None:
        """Time spent outside training steps (validation, a snapshot): part of no step."""
        self.excluded += seconds

    def agreement_waits(self) -> list[float]:
        """What this rank adds to the stop agreement: the negated waits of the steps since the last one."""
        return list(self.waits)

    def agreed(self, step: int, seconds: float, max_of_negated_waits: list[float]) -> None:
        """The agreement before step ``step + 1`` took ``seconds``; it returned the per-step maximum of the
        negated waits, i.e. the smallest wait of each step: that step's exposed all-reduce."""
        if self.window_start is None:  # (never set when the recording is off)
            return
        self.sums["agree_s"] += seconds
        for own, best in zip(self.waits, max_of_negated_waits):
            if own > UNTIMED / 2 and best > UNTIMED / 2:
                transfer = min(-best, -own)
                self.sums["allreduce_s"] += transfer
                self.sums["idle_s"] += -own - transfer
        self.waits = [UNTIMED] * AGREE_SLOTS
        if step % WINDOW_STEPS == 0:
            self._close(time.perf_counter())

    def _close(self, now: float) -> None:
        """The window ends now: its fields wait for the next metric row."""
        steps, timed = self.window_steps, self.timed_steps
        if steps and timed:
            start = self.window_start if self.window_start is not None else now
            fields: dict[str, Any] = {"step_s": (now - start - self.excluded) / steps,
                                      "rank_batch": round(self.batch_sum / steps)}
            for name in ("data_s", "compute_s", "allreduce_s", "idle_s", "optimizer_s", "report_s"):
                fields[name] = self.sums[name] / timed
            fields["agree_s"] = self.sums["agree_s"] / steps
            if self.noise is not None and all(math.isfinite(v) for v in self.noise):
                fields["grad_sq"], fields["grad_sq_global"] = self.noise
            self.closed = fields
        self.window_start = now
        self._reset_window()

    def take_window(self) -> dict[str, Any]:
        """The fields of the window closed since the last call (for a metric row), or an empty dict."""
        fields, self.closed = self.closed, {}
        return fields
