"""Training under a wall-clock budget: a lent GPU machine gives a command 10 minutes, so a
training stage stops before the step that would run past its `time_limit_s`, saves what it has
and says where it stopped (the report's `stopped_at`), instead of being killed with nothing saved.
`interrupts()` turns SIGTERM into KeyboardInterrupt, so a stage can save its finished steps when it
is stopped from outside too."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from pipeline import distributed


def time_limit(seconds: float | None):
    """A transformers TrainerCallback that ends training once another step, as long as the longest
    so far, would end past `seconds` (None: no limit). GRPO steps vary (28-118 s on the H200), so
    stopping only after the limit had passed let a step run past the command's own limit and lose
    the run. The main process's clock decides, so every process stops at the same step."""
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        def __init__(self):
            self.start = self.step_start = None
            self.longest = 0.0
            self.stopped_at = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            self.step_start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if seconds is None:
                return
            now = time.perf_counter()
            self.longest = max(self.longest, now - (self.step_start or self.start))
            stop = [now - self.start + self.longest > seconds]
            if distributed.world_size() > 1:
                import torch.distributed as dist

                dist.broadcast_object_list(stop, src=0)
            if stop[0]:
                control.should_training_stop = True
                self.stopped_at = state.global_step

    return TimeLimit()


@contextlib.contextmanager
def interrupts():
    """Within: SIGTERM (a scheduler's or Prefect's cancel) raises KeyboardInterrupt like Ctrl-C,
    so the caller's `except KeyboardInterrupt` saves its work. Only the main thread can do so."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
