"""The search stage's DLight baselines: each shard's workloads built with DLight's default schedule
and timed, written to the shard's `baselines.json`.

Inline, a shard's baselines are built and timed after its tuning, while the build workers and the
GPU wait (on the H200, session 21: 12.9 s for 5 workloads beside 71.4 s of tuning, about 2.6 s a
workload: a sixth of a process's time). `beside=True` (the search's `overlap` mode) times them on a
thread of their own while the next shard is tuned: the build goes on beside the search, and the
timing takes the GPU's lock (pipeline.device_lock) like every measurement of the tuning, so no two
timings overlap. A process whose GPU is not shared gets a lock file of its own for the while.
Baselines not written when a run stops are timed by the next run (`missing`).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from pipeline import device_lock, files
from pipeline.measure import measure_baseline
from pipeline.workloads import Spec, build


def time_shard(shard_dir: Path, shard: list[Spec], target) -> float:
    """Build and time the shard's workloads that `baselines.json` lacks; seconds spent."""
    start = time.perf_counter()
    path = shard_dir / "baselines.json"
    baselines = json.loads(path.read_text()) if path.exists() else {}
    missing = [spec for spec in shard if spec.id not in baselines]
    for spec in missing:
        t = measure_baseline(build(spec), target)
        baselines[spec.id] = {"latency_s": t.latency_s, "error": t.error}
        files.write_json(path, baselines)      # each as it comes: a stopped run keeps what it timed
    if not path.exists():
        files.write_json(path, baselines)
    return time.perf_counter() - start


class Timer:
    """Times shards' baselines, inline or beside the tuning (a context manager: leaving it waits
    for what was submitted, or drops it when leaving on an exception)."""

    def __init__(self, target, beside: bool, lock_path: Path | str) -> None:
        self.target, self.beside, self.lock_path = target, beside, str(lock_path)
        self.background_s = 0.0        # time spent on a thread beside the tuning
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="baselines") if beside else None
        self._futures, self._own_lock = [], False

    def __enter__(self) -> "Timer":
        if self.beside and not device_lock.path():
            self._own_lock = True
            os.environ[device_lock.ENV] = self.lock_path
        return self

    def submit(self, shard_dir: Path, shard: list[Spec], then: Callable[[], None] | None = None) -> float:
        """The shard's baselines (then `then()`, e.g. archiving the shard again); the seconds the
        caller spent on them: all of it inline, none beside."""
        if not self.beside:
            return self._time(shard_dir, shard, then)
        self._futures.append(self._pool.submit(self._beside, shard_dir, shard, then))
        return 0.0

    def _time(self, shard_dir, shard, then) -> float:
        seconds = time_shard(shard_dir, shard, self.target)
        if then is not None:
            then()
        return seconds

    def _beside(self, shard_dir, shard, then) -> None:
        self.background_s += self._time(shard_dir, shard, then)

    def wait(self) -> float:
        """Wait for the submitted shards; the seconds waited (an error in one is raised here)."""
        start = time.perf_counter()
        try:
            for f in self._futures:
                f.result()
        finally:
            self._futures = []
        return time.perf_counter() - start

    def __exit__(self, kind, *_) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=kind is None, cancel_futures=kind is not None)
        if self._own_lock:
            os.environ.pop(device_lock.ENV, None)
            Path(self.lock_path).unlink(missing_ok=True)
