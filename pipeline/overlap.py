"""Overlapped building and measuring for GPU searches (`search.overlap: true`).

MetaSchedule's task scheduler (src/s_tir/meta_schedule/task_scheduler/task_scheduler.cc,
`TaskSchedulerNode::Tune`) does one thing at a time: it generates a task's batch (search
strategy), waits for `Builder.Build` to return every artifact, then calls `Runner.Run`, and
TVM's `LocalRunner.run` calls each candidate's `future.result()` before it returns
(runner/local_runner.py), so the GPU measures while the CPU waits, and the CPU searches and
builds while the GPU idles. Only the RPC runner returns unfinished futures.

Here both calls return at once:
- `OverlapBuilder.build` submits the batch's builds to the kept pool of build processes and
  answers with the shared library each one will write (its own temporary folder, which MetaSchedule's
  `RemoveBuildArtifact` callback deletes after the task is joined, as with LocalBuilder's).
- `OverlapRunner.run` starts a thread for the batch that waits for its builds, measures the
  built ones with the real runner (holding the GPU's lock where processes share it), and
  resolves one future per candidate.
The scheduler meanwhile generates and submits the next task's batch; it joins a task's futures
when its round robin comes back to that task (`JoinRunningTask`), where the measurements are
first needed (the strategy, the cost model, the database). So with several tasks in a run
(the search stage's shards hold 4), searching, building and measuring proceed side by side; a
single task gains nothing, and loses nothing.

A build that failed reaches MetaSchedule as a runner result carrying the builder's message
(`LocalBuilder: ...`, as PoolBuilder words it): the record is stored as failed (run_secs 1e10)
as before, and `is_build_error` tells the stage's error log that it failed in building.
For GPU targets only: a CPU kernel timed while the cores build would be timed wrong.
"""

from __future__ import annotations

import threading
import time

from pipeline.tuning import BatchFuture, Phases, PoolBuilder, export_shared, measure_locked, shared_path
from pipeline.tvm_env import ms, tvm

BUILD_ERROR_PREFIX = "LocalBuilder: "


def is_build_error(message) -> bool:
    """Whether a runner result's error is a build failure passed on by OverlapRunner."""
    return bool(message) and str(message).startswith(BUILD_ERROR_PREFIX)


def build_to(mod, target, params, path: str, f_build=None) -> str:
    """In a build worker: LocalBuilder's build (`f_build`, default `default_build`), linked into
    the shared library named beforehand (`tuning.export_shared`)."""
    from tvm.s_tir.meta_schedule.builder.local_builder import _deserialize_params, default_build

    return export_shared((f_build or default_build)(mod, target, _deserialize_params(params)), path)


class Busy:
    """Wall time during which at least one item was in flight (thread-safe)."""

    def __init__(self) -> None:
        self.seconds, self._n, self._since, self._lock = 0.0, 0, 0.0, threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._n == 0:
                self._since = time.perf_counter()
            self._n += 1

    def end(self) -> None:
        with self._lock:
            self._n -= 1
            if self._n == 0:
                self.seconds += time.perf_counter() - self._since


@tvm.ir.utils.derived_object
class OverlapBuilder(PoolBuilder._cls):   # TVM's derived_object: subclass the undecorated class
    """PoolBuilder's workers and messages; `build` returns before the builds end."""

    def __init__(self, max_workers: int, timeout_sec: float, phases: Phases, recycle_after: int = 16,
                 f_build=None) -> None:
        super().__init__(max_workers, timeout_sec, phases, recycle_after, f_build)
        self.pending: dict[str, object] = {}     # artifact path -> concurrent future of its build
        self.busy, self._lock = Busy(), threading.Lock()

    def _get_pool(self):
        with self._lock:
            busy = bool(self.pending)
        if busy:          # never recycle under builds in flight: reuse the pool until it is idle
            self._uses = min(self._uses, self.recycle_after - 1)
        return super()._get_pool()

    def build(self, build_inputs):
        from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params

        start = time.perf_counter()
        pool, out = self._get_pool(), []
        for b in build_inputs:
            path = shared_path()
            self.busy.start()
            future = pool.submit(build_to, b.mod, b.target, _serialize_params(b.params), path, self.f_build)
            future.add_done_callback(lambda _f: self.busy.end())
            with self._lock:
                self.pending[path] = future
            out.append(ms.builder.BuilderResult(path, None))
        self.phases.built(start, len(build_inputs))
        self._start_successor()       # its workers start beside these builds (the pool is replaced once idle)
        return out

    def wait(self, path: str) -> str | None:
        """Block until the build writing `path` ends: None when it succeeded, else its error in
        LocalBuilder's words. (Its folder stays: MetaSchedule's RemoveBuildArtifact removes it.)"""
        with self._lock:
            future = self.pending.get(path)
        if future is None:
            return None       # not built here (an artifact MetaSchedule made otherwise)
        try:
            future.result()
            return None
        except TimeoutError:
            return f"{BUILD_ERROR_PREFIX}Timeout, killed after {self.timeout_sec} seconds"
        except Exception as err:   # noqa: BLE001 - whatever the build raised is the candidate's error
            return f"{BUILD_ERROR_PREFIX}An exception occurred\n{err}"
        finally:       # pending until it has ended: the pool is never recycled under it
            with self._lock:
                self.pending.pop(path, None)

    def shutdown(self) -> None:
        super().shutdown()
        with self._lock:
            self.pending.clear()


class _Batch:
    """One batch: wait for its builds, measure the built ones, one result per candidate."""

    def __init__(self, builder: OverlapBuilder, inner, runner_inputs, phases: Phases, measuring: Busy) -> None:
        self.n, self.results, self.finished = len(runner_inputs), None, threading.Event()
        threading.Thread(target=self._run, args=(builder, inner, runner_inputs, phases, measuring),
                         daemon=True).start()

    def _run(self, builder, inner, runner_inputs, phases, measuring) -> None:
        results = [None] * self.n
        try:
            errors = [builder.wait(str(x.artifact_path)) for x in runner_inputs]
            built = [i for i, e in enumerate(errors) if e is None]
            for i, e in enumerate(errors):
                if e is not None:
                    results[i] = ms.runner.RunnerResult(None, e)
            if built:
                measured = measure_locked(inner, [runner_inputs[i] for i in built], phases, "OverlapRunner",
                                          measuring)
                for i, r in zip(built, measured):
                    results[i] = r
        except Exception as err:   # noqa: BLE001 - a failed batch is data: its open candidates get the error
            results = [r or ms.runner.RunnerResult(None, f"OverlapRunner: {type(err).__name__}: {err}")
                       for r in results]
        self.results = results
        self.finished.set()


@tvm.ir.utils.derived_object
class OverlapRunner(ms.runner.PyRunner):
    """`inner`'s measurements of artifacts that `builder` is still building; `run` returns at once."""

    def __init__(self, builder: OverlapBuilder, inner, phases: Phases) -> None:
        super().__init__()
        self.builder, self.inner, self.phases, self.measuring = builder, inner, phases, Busy()

    def run(self, runner_inputs):
        batch = _Batch(self.builder, self.inner, runner_inputs, self.phases, self.measuring)
        return [BatchFuture(batch, i) for i in range(batch.n)]
