"""MetaSchedule tuning as the project runs it: the search stage's campaign and the
evaluation's yardstick both call `tune`.

What differs from `ms.tune.tune_tasks` with stock parts, and why (measured on the H200,
reports/bench_search_h200_before.json, ..._after.json):
- `PoolBuilder` keeps its build worker processes across rounds. TVM's `LocalBuilder` starts
  a fresh pool of `max_workers` processes every round (its guard against a worker memory
  leak), and each new worker imports TVM and its tensor intrinsics before it builds anything.
  Here the pool lives `recycle_after` rounds, then is replaced, which keeps the guard.
- Every phase is timed (`Phases`): building, measuring (TVM's LocalRunner measures inside
  `Runner.run`: the scheduler waits there, not on the futures), waiting for futures, and the
  rest (the search strategy: evolutionary search, cost model, postprocessors; database;
  callbacks), so a throughput figure comes with where the time went. Until session 17 the
  measuring was counted in the rest, which was then read as the search strategy's time.
- The build workers link each candidate into a shared library (`export_shared`). LocalBuilder
  exports a tar of object files, and TVM's `load_module` links a tar when it loads it: inside
  LocalRunner's single worker, so one candidate after another (50-75 ms each here, a CUDA
  matmul), where the builders link side by side.
- With `overlap` (GPU targets, pipeline/overlap.py) builds and measurements run beside the
  search instead of in turn.
- A process that shares its GPU with other tuning processes (pipeline.device_lock) measures
  each batch while it holds the GPU's lock (`LockedRunner`), so timings never overlap.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

from pipeline import device_lock
from pipeline.tvm_env import ms, tvm, worker_init


@dataclass
class Phases:
    seconds: float = 0.0           # wall time of the tuning run
    build_s: float = 0.0           # inside the builder (the task scheduler waits for it)
    run_s: float = 0.0             # inside Runner.run (LocalRunner measures there; the scheduler waits)
    run_wait_s: float = 0.0        # waiting for runner results
    rounds: int = 0                # builder calls
    candidates: int = 0            # candidates sent to the builder
    lock_wait_s: float = 0.0       # waiting for a shared GPU's lock (pipeline.device_lock)
    # with overlap: wall time with builds in flight / with the runner measuring (beside the rest)
    build_busy_s: float = 0.0
    measure_busy_s: float = 0.0
    # outside the tuning (the search stage): the workloads' DLight baselines, built and timed (with
    # overlap, beside the next shard's tuning: then only the wait for the last shard's counts here,
    # and `baseline_beside_s` is their time on their own thread)
    baseline_s: float = 0.0
    baseline_beside_s: float = 0.0
    # tuning runs that TVM's task scheduler ended by raising (their measured records are kept)
    failed_run_s: float = 0.0

    @property
    def other_s(self) -> float:
        """Search strategy, cost model, database and callbacks."""
        return max(0.0, self.seconds - self.build_s - self.run_s - self.run_wait_s)

    def built(self, start: float, candidates: int) -> None:
        """Account one builder call that began at `start` (perf_counter)."""
        self.build_s += time.perf_counter() - start
        self.rounds += 1
        self.candidates += candidates

    def add(self, other: "Phases") -> None:
        for k in ("seconds", "build_s", "run_s", "run_wait_s", "rounds", "candidates", "lock_wait_s",
                  "build_busy_s", "measure_busy_s", "baseline_s", "baseline_beside_s", "failed_run_s"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def to_json(self) -> dict:
        out = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        out["other_s"] = round(self.other_s, 2)
        out["candidates_per_min"] = round(60 * self.candidates / self.seconds, 1) if self.seconds else None
        return out


SHARED_NAME = "tvm_tmp_mod.so"


def shared_path() -> str:
    """A new artifact path: its own temporary folder, as LocalBuilder's `default_export` makes
    (MetaSchedule's RemoveBuildArtifact callback removes it after the task is joined)."""
    return os.path.join(tempfile.mkdtemp(prefix="ld-build-"), SHARED_NAME)


def export_shared(rt_mod, path: str | None = None) -> str:
    """In a build worker: the built module linked into a shared library (`export_library`'s
    default compiler), so the runner loads it without linking. Returns its path."""
    path = path or shared_path()
    rt_mod.export_library(path)
    return path


def _started() -> bool:
    return True


@tvm.ir.utils.derived_object
class PoolBuilder(ms.builder.PyBuilder):
    """LocalBuilder's work (its build function, its error messages; each artifact linked by
    `export_shared` rather than tarred) with one pool of worker processes kept for
    `recycle_after` rounds."""

    def __init__(self, max_workers: int, timeout_sec: float, phases: Phases, recycle_after: int = 16,
                 f_build=None) -> None:
        super().__init__()
        self.max_workers, self.timeout_sec, self.recycle_after = max_workers, timeout_sec, recycle_after
        self.phases, self._pool, self._uses = phases, None, 0
        self._next = None          # the pool that takes over at the next recycle, already started
        self.f_build = f_build     # LocalBuilder's f_build: None (its default_build) or a picklable function

    def _fresh_pool(self):
        """A pool whose workers are started now: each submits nothing but starts (a process that
        imports TVM, 5-16 s on 2 cores) on a thread of the pool, beside whatever runs meanwhile,
        rather than inside the next round's builds."""
        from tvm.support.popen_pool import PopenPoolExecutor

        pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec, initializer=worker_init)
        pool.started = [pool.submit(_started) for _ in range(self.max_workers)]
        return pool

    def warm(self) -> None:
        """Start the first pool's workers now (the stage calls it before its first shard)."""
        if self._pool is None and self._next is None:
            self._next = self._fresh_pool()

    def _get_pool(self):
        if self._pool is not None and self._uses >= self.recycle_after:
            self._pool.shutdown()
            self._pool = None
        if self._pool is None:
            self._pool, self._next = self._next or self._fresh_pool(), None
            self._uses = 0
        self._uses += 1
        return self._pool

    def _start_successor(self) -> None:
        """After the pool's last round was handed out: its successor's workers start now, while
        the search strategy takes its turn, rather than in the next round's builds."""
        if self._uses >= self.recycle_after and self._next is None:
            self._next = self._fresh_pool()

    def shutdown(self) -> None:
        for pool in (self._pool, self._next):
            if pool is not None:
                pool.shutdown()
        self._pool = self._next = None

    def build(self, build_inputs):
        from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params, _worker_func
        from tvm.support.popen_pool import StatusKind

        start = time.perf_counter()
        results = []
        jobs = [(self.f_build, export_shared, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]
        for r in self._get_pool().map_with_error_catching(lambda x: _worker_func(*x), jobs):
            if r.status == StatusKind.COMPLETE:
                results.append(ms.builder.BuilderResult(r.value, None))
            elif r.status == StatusKind.TIMEOUT:
                results.append(ms.builder.BuilderResult(
                    None, f"LocalBuilder: Timeout, killed after {self.timeout_sec} seconds"))
            else:
                results.append(ms.builder.BuilderResult(None, "LocalBuilder: An exception occurred\n" + str(r.value)))
        self.phases.built(start, len(build_inputs))
        self._start_successor()
        return results


@tvm.ir.utils.derived_object
class _TimedFuture(ms.runner.PyRunnerFuture):
    def __init__(self, inner, phases: Phases) -> None:
        super().__init__()
        self.inner, self.phases = inner, phases

    def done(self) -> bool:
        return self.inner.done()

    def result(self):
        start = time.perf_counter()
        out = self.inner.result()
        self.phases.run_wait_s += time.perf_counter() - start
        return out


@tvm.ir.utils.derived_object
class TimedRunner(ms.runner.PyRunner):
    """A runner whose futures record how long the task scheduler waits for them."""

    def __init__(self, inner, phases: Phases) -> None:
        super().__init__()
        self.inner, self.phases = inner, phases

    def run(self, runner_inputs):
        start = time.perf_counter()
        futures = self.inner.run(runner_inputs)
        self.phases.run_s += time.perf_counter() - start
        return [_TimedFuture(f, self.phases) for f in futures]


class _LockedBatch:
    """One runner batch, measured in a thread of its own once the device lock is held (the
    task scheduler goes on searching and building other tasks meanwhile, as with the plain
    runner, whose futures it joins later)."""

    def __init__(self, inner, runner_inputs, phases: Phases) -> None:
        self.n, self.results, self.finished = len(runner_inputs), None, threading.Event()
        threading.Thread(target=self._measure, args=(inner, runner_inputs, phases), daemon=True).start()

    def _measure(self, inner, runner_inputs, phases: Phases) -> None:
        try:
            self.results = measure_locked(inner, runner_inputs, phases, "LockedRunner")
        finally:
            self.finished.set()


def measure_locked(inner, runner_inputs, phases: Phases, label: str, busy=None) -> list:
    """`inner`'s results for `runner_inputs`, measured while this process holds its GPU's lock
    (no lock where the GPU is not shared; the wait goes to `phases.lock_wait_s`). A failed batch
    is data: every candidate gets the error, named by `label`. `busy` (start/end): told while
    the measuring, not the wait for the lock, goes on."""
    try:
        with device_lock.held() as waited:
            phases.lock_wait_s += waited
            if busy is not None:
                busy.start()
            try:
                return [f.result() for f in inner.run(runner_inputs)]
            finally:
                if busy is not None:
                    busy.end()
    except Exception as err:   # noqa: BLE001 - a failed batch is data: every candidate gets the error
        return [ms.runner.RunnerResult(None, f"{label}: {type(err).__name__}: {err}")] * len(runner_inputs)


@tvm.ir.utils.derived_object
class BatchFuture(ms.runner.PyRunnerFuture):
    """Candidate `index` of a batch measured on a thread of its own (an object with a
    `finished` event and `results`, set when the thread ends)."""

    def __init__(self, batch, index: int) -> None:
        super().__init__()
        self.batch, self.index = batch, index

    def done(self) -> bool:
        return self.batch.finished.is_set()

    def result(self):
        self.batch.finished.wait()
        return self.batch.results[self.index]


@tvm.ir.utils.derived_object
class LockedRunner(ms.runner.PyRunner):
    """`inner`'s measurements of a batch, made while this process holds its GPU's lock."""

    def __init__(self, inner, phases: Phases) -> None:
        super().__init__()
        self.inner, self.phases = inner, phases

    def run(self, runner_inputs):
        batch = _LockedBatch(self.inner, runner_inputs, self.phases)
        return [BatchFuture(batch, i) for i in range(batch.n)]


@tvm.ir.utils.derived_object
class ReplayFirst(ms.search_strategy.PySearchStrategy):
    """MetaSchedule's evolutionary search, except that a task's first batch is sampled
    straight from the design space (ReplayTrace: replay a sketch with random decisions,
    postprocess). Why: before the first measurement the cost model is untrained and predicts
    zeros, so the evolutionary search's first round postprocesses a population of
    `population_size` x (1 + `genetic_num_iters`) schedules only to pick a batch that is
    random anyway; that round is most of a short (32-64 trial) task's CPU time. From the
    second batch on, the evolutionary search runs as usual, with the first batch in the
    database and the cost model trained on it."""

    def __init__(self, population_size: int, genetic_num_iters: int, init_min_unmeasured: int = 50,
                 max_fail_count: int = 5) -> None:
        super().__init__()
        self.population_size, self.genetic_num_iters = population_size, genetic_num_iters
        self.init_min_unmeasured, self.max_fail_count = init_min_unmeasured, max_fail_count
        self.replay = ms.search_strategy.ReplayTrace()
        self.evolve = ms.search_strategy.EvolutionarySearch(population_size=population_size,
                                                            genetic_num_iters=genetic_num_iters,
                                                            init_min_unmeasured=init_min_unmeasured,
                                                            max_fail_count=max_fail_count)
        self.first, self.evolve_trials = True, 0

    def _initialize_with_tune_context(self, context) -> None:
        self.replay._initialize_with_tune_context(context)
        self.evolve._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None) -> None:
        self.first = True
        first = min(max_trials, num_trials_per_iter)
        self.replay.pre_tuning(first, num_trials_per_iter, design_spaces, database, cost_model)
        # the task's budget is shared: the evolutionary search gets what the first batch left
        # (given all of it, a task measured up to max_trials + one batch where the run's global
        # budget did not stop it first)
        self.evolve_trials = max_trials - first
        if self.evolve_trials > 0:
            self.evolve.pre_tuning(self.evolve_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.replay.post_tuning()
        if self.evolve_trials > 0:
            self.evolve.post_tuning()

    def generate_measure_candidates(self):
        if self.first:
            candidates = self.replay.generate_measure_candidates()
            if candidates:
                return candidates
            self.first = False
        if self.evolve_trials <= 0:
            return None
        return self.evolve.generate_measure_candidates()

    def notify_runner_results(self, measure_candidates, results) -> None:
        (self.replay if self.first else self.evolve).notify_runner_results(measure_candidates, results)
        self.first = False

    def clone(self):
        return ReplayFirst(self.population_size, self.genetic_num_iters, self.init_min_unmeasured,
                           self.max_fail_count)


def strategy(sp):
    """The search strategy the search params ask for (`first_round`). `init_min_unmeasured`:
    each evolutionary round samples the design space until that many valid schedules are found
    (MetaSchedule's default 50); on a design space where most samples fail the GPU checks, that
    floor, not the population, sets the round's sampling cost (pipeline.bench.strategy)."""
    if sp.first_round == "replay":
        return ReplayFirst(sp.population_size, sp.genetic_num_iters, sp.init_min_unmeasured, sp.max_fail_count)
    return ms.search_strategy.EvolutionarySearch(population_size=sp.population_size,
                                                 genetic_num_iters=sp.genetic_num_iters,
                                                 init_min_unmeasured=sp.init_min_unmeasured,
                                                 max_fail_count=sp.max_fail_count)


def make_runner(sp):
    """MetaSchedule's LocalRunner (the default), or its RPCRunner when `sp.runner` is "rpc":
    candidates are built here and measured by whatever RPC servers registered with the
    tracker at `sp.rpc_tracker` under `sp.rpc_key` (any number of GPU hosts)."""
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=sp.min_repeat_ms)
    if sp.runner == "rpc":
        host, _, port = sp.rpc_tracker.rpartition(":")
        return ms.runner.RPCRunner(
            rpc_config=ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=sp.rpc_key,
                                           # a server started with --no-fork spawns each session: interpreter,
                                           # TVM import and CUDA context take ~25 s on the H200 host before the run
                                           session_timeout_sec=sp.run_timeout_s + 60),
            evaluator_config=evaluator, max_workers=sp.rpc_workers, initializer=worker_init)
    return ms.runner.LocalRunner(timeout_sec=sp.run_timeout_s, initializer=worker_init, evaluator_config=evaluator)


def tune(sp, target, mods: list[tuple[str, "tvm.IRModule"]], work_dir, budget: int, trials_per_iter: int,
         callbacks=(), logger: str = "search", pool: "PoolBuilder | None" = None, search_strategy=None,
         cost_model=None, overlap: bool = False, runner=None) -> Phases:
    """Tune `mods` (name, module) with the search stage's settings `sp` (evolutionary search,
    the project's design space, round-robin over the tasks) into a JSONDatabase in `work_dir`.
    `pool`: a PoolBuilder the caller keeps across calls (its workers then start once per
    campaign, not once per call). `cost_model`: MetaSchedule's cost model object for the run
    (default its XGBModel, untrained: e.g. pipeline.cost_model.CostModel.as_metaschedule() for
    one pre-trained on a search campaign). `overlap`: build and measure beside the search
    (pipeline/overlap.py; GPU targets; `pool` must then be an OverlapBuilder). Returns where the
    time went. `runner`: MetaSchedule's runner to measure with (default: `make_runner(sp)`)."""
    from pipeline import overlap as ov
    from pipeline.measure import is_gpu
    from pipeline.space import generator

    if overlap and not is_gpu(target):
        raise ValueError(f"overlap measures while the cores build: for GPU targets only, not {target.kind.name}")

    phases = Phases()
    tasks = [ms.TuneContext(
        mod=mod, target=target, space_generator=generator(target),
        search_strategy=search_strategy if search_strategy is not None else strategy(sp),
        task_name=name, rand_state=sp.seed, num_threads=sp.builder_workers,
        logger=ms.logging.get_logger(f"little_dragon.{logger}.{name}")).clone() for name, mod in mods]
    owned = pool is None
    if pool is not None:
        if overlap != isinstance(pool, ov.OverlapBuilder):
            raise ValueError("tune: overlap needs an OverlapBuilder as its pool, and only then")
        builder = pool
        builder.phases = phases
    elif overlap:
        builder = ov.OverlapBuilder(sp.builder_workers, sp.build_timeout_s, phases)
    elif sp.persistent_builder:
        builder = PoolBuilder(sp.builder_workers, sp.build_timeout_s, phases)
    else:   # TVM's stock builder (a fresh pool every round), kept for the before/after benchmark
        builder = _TimedLocalBuilder(ms.builder.LocalBuilder(
            max_workers=sp.builder_workers, timeout_sec=sp.build_timeout_s, initializer=worker_init), phases)
    runner = make_runner(sp) if runner is None else runner
    if overlap:        # takes the device lock itself, per batch
        runner = ov.OverlapRunner(builder, runner, phases)
    elif device_lock.path() and sp.runner == "local":
        runner = LockedRunner(runner, phases)
    timed = TimedRunner(runner, phases)
    busy_before = builder.busy.seconds if overlap else 0.0
    start = time.perf_counter()
    try:
        ms.tune.tune_tasks(
            tasks=tasks, task_weights=[1.0] * len(tasks), work_dir=str(work_dir),
            max_trials_global=budget * len(tasks), max_trials_per_task=budget,
            num_trials_per_iter=trials_per_iter, builder=builder, runner=timed,
            database=ms.database.JSONDatabase(work_dir=str(work_dir)),
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), *callbacks],
            task_scheduler="round-robin", **({"cost_model": cost_model} if cost_model is not None else {}),
        )
    finally:
        phases.seconds = time.perf_counter() - start
        if overlap:
            phases.build_busy_s = builder.busy.seconds - busy_before
            phases.measure_busy_s = runner.measuring.seconds
        if owned and isinstance(builder, (PoolBuilder, ov.OverlapBuilder)):
            builder.shutdown()
    return phases


@tvm.ir.utils.derived_object
class _TimedLocalBuilder(ms.builder.PyBuilder):
    def __init__(self, inner, phases: Phases) -> None:
        super().__init__()
        self.inner, self.phases = inner, phases

    def build(self, build_inputs):
        start = time.perf_counter()
        out = self.inner.build(build_inputs)
        self.phases.built(start, len(build_inputs))
        return out
