"""Data-parallel training under `accelerate launch` (or torchrun): which process this is.

The training stages read the launcher's environment (RANK, WORLD_SIZE); one process is the
main one and alone writes the model, the report and the MLflow run. `batch_size` in params
is the global batch, split over the processes, so a run on 1 and on N devices takes the same
optimisation steps on the same amount of data per step.
"""

from __future__ import annotations

import os

from pipeline import params as P


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def per_device_batch(global_batch: int) -> int:
    n = world_size()
    P.require(global_batch % n == 0 and global_batch >= n,
              f"batch_size {global_batch} must be a multiple of the {n} training processes")
    return global_batch // n


def fsdp_enabled() -> bool:
    """accelerate's FSDP plugin is on for this launch (its config sets this variable)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def local_device() -> int:
    """The GPU of this process (accelerate and torchrun set LOCAL_RANK; the reward's checker
    workers inherit it), 0 when not launched."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def unsharded(trainer, save_dir: str):
    """The trained model as one process can use it. Under FSDP the weights are sharded over
    the processes: every process takes part in the trainer's gathering save (full weights, or
    the LoRA adapters), and the main process loads the result; otherwise the trainer's model."""
    if not fsdp_enabled():
        return trainer.model
    trainer.save_model(save_dir)
    trainer.accelerator.wait_for_everyone()
    if not is_main():
        return None
    from pipeline import models

    model, _ = models.load(save_dir, merge=False)   # an adapter stays one: it is saved as such
    return model


def gather(items: list) -> list:
    """All processes' lists concatenated (in rank order) on every process; the list itself
    when not launched."""
    if world_size() == 1:
        return items
    import torch.distributed as dist

    out: list = [None] * world_size()
    dist.all_gather_object(out, items)
    return [x for part in out for x in part]
