"""Training under a wall-clock budget: a lent GPU machine gives a command 10 minutes, so a
training stage stops at the step where its `time_limit_s` runs out, saves what it has and says
where it stopped (the report's `stopped_at`), instead of being killed with nothing saved."""

from __future__ import annotations

import time

from pipeline import distributed


def time_limit(seconds: float | None):
    """A transformers TrainerCallback that ends training after `seconds` (None: no limit).
    The main process's clock decides, so every process stops at the same step."""
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        def __init__(self):
            self.start = None
            self.stopped_at = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if seconds is None:
                return
            stop = [time.perf_counter() - self.start >= seconds]
            if distributed.world_size() > 1:
                import torch.distributed as dist

                dist.broadcast_object_list(stop, src=0)
            if stop[0]:
                control.should_training_stop = True
                self.stopped_at = state.global_step

    return TimeLimit()
