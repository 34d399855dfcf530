"""Several processes on one GPU: their measurements take turns.

Why: a MetaSchedule run leaves its GPU idle most of the time (on the H200, per 128 candidates:
~34 s building and 49-72 s of search strategy on the CPU for a few seconds of measuring), so
two or three tuning processes can share one GPU; but two timings at once would disturb each
other. A process that shares its GPU names a lock file in `LITTLE_DRAGON_DEVICE_LOCK` (the
search stage does so for a GPU listed more than once in `search.devices`), and every
measurement holds it: a MetaSchedule runner's batch (`pipeline.tuning.LockedRunner`) and the
checker's runs and timings (`pipeline.verify.Checker`), and the evaluation's generation (a
`lease`, paused while guided decoding works on the host). It is an `flock`, so the kernel
releases it when its holder dies; unset, nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

ENV = "LITTLE_DRAGON_DEVICE_LOCK"


def path() -> str | None:
    """The lock file this process's measurements hold, or None (the GPU is not shared)."""
    return os.environ.get(ENV) or None


@contextlib.contextmanager
def _locked(lock_path: str | None):
    """(the lock file's descriptor or None when nothing is locked, seconds spent waiting)."""
    lock_path = lock_path or path()
    if not lock_path:
        yield None, 0.0
        return
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        start = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd, time.perf_counter() - start
    finally:
        os.close(fd)        # closing the descriptor releases the lock


@contextlib.contextmanager
def held(lock_path: str | None = None):
    """Hold the device lock (`lock_path`, default this process's) for the block; yields the
    seconds spent waiting for it."""
    with _locked(lock_path) as (_, waited):
        yield waited


class Lease:
    """The device lock held for a block of work that is partly on the host: `paused()` lets the
    other processes measure meanwhile (guided decoding's mask work between two forward passes of
    the model) and takes the lock back before the device is used again."""

    def __init__(self, fd: int | None):
        self.fd = fd

    @contextlib.contextmanager
    def paused(self):
        if self.fd is None:
            yield
            return
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_EX)


@contextlib.contextmanager
def lease(lock_path: str | None = None):
    """Hold the device lock for the block, as `held` does, yielding a Lease that can pause it."""
    with _locked(lock_path) as (fd, _):
        yield Lease(fd)
