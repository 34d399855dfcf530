"""Stage 1, search: MetaSchedule tuning over a slice of the catalog (LLVM on the CPU default,
CUDA in the GPU profile); every candidate kept.

    little-dragon search [--params params.yaml]

Writes `data/search/shard-NNNN/` (one MetaSchedule JSONDatabase per shard of workloads, plus
`workloads.json`, `baselines.json` and `errors.jsonl`), `data/search/throughput.jsonl` (per
shard tuned: candidates, seconds and where they went) and `reports/search.json` (with this
run's candidates per minute). With `devices: [0, 1]` one process per GPU measures alternate
shards at once, each on its own share of the cores; `devices: [0, 0]` runs two processes on
one GPU, taking turns to measure (pipeline.device_lock).

Resumable: a workload whose database already holds its trial budget is skipped, and
JSONDatabase appends each measured candidate as it comes, so an interrupted run loses at
most the candidates in flight. A candidate that fails to build or run is data: MetaSchedule
stores it with run_secs 1e10 and its error message goes to `errors.jsonl`. So does an
exception of TVM's: a workload whose design space cannot be generated is listed in
`failed.json` and the shard's others are tuned together again, or else one at a time, and a
workload that fails alone is listed there too; none is retried. One whose search ends short
of its budget (the design space gives nothing new) goes to `exhausted.json`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import multiprocessing
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from pipeline import archive, baselines, cluster, device_lock, files, hostcpu, overlap, params as P, records, tuning
from pipeline.stats import geomean
from pipeline.tuning import Phases
from pipeline.tvm_env import last_line, make_target, ms, structural_hash, tvm
from pipeline.workloads import FAMILIES, Spec, build, catalog, held_out_hashes

@dataclass
class SearchParams:
    target: str | dict
    families: list[str]
    num_workloads: int
    trials_per_workload: int
    seed: int = 0
    max_mflop: float = 1e9          # skip workloads larger than this (keeps CPU runs short)
    # ... or with more tensor elements than this: bad candidates (a reduction recomputed per
    # element, seen with softmax 64x30522) take minutes, and each costs a runner timeout.
    max_elements: int = 10**9
    trials_per_iter: int = 16
    shard_size: int = 4
    builder_workers: int = 2
    build_timeout_s: float = 30.0
    run_timeout_s: float = 30.0
    min_repeat_ms: int = 100          # TVM's time evaluator: repeat a run until it lasts this long
    population_size: int = 512       # evolutionary search; MetaSchedule's default
    genetic_num_iters: int = 4
    init_min_unmeasured: int = 50    # valid random samples an evolutionary round needs (MetaSchedule's default)
    max_fail_count: int = 5          # sampling passes with no valid sample before a round gives up (MetaSchedule's)
    work_dir: str = "data/search"
    report: str = "reports/search.json"
    offset: int = 0                  # skip this many eligible workloads (held-out splits, sharding across machines)
    persistent_builder: bool = True  # keep build workers across rounds (pipeline.tuning.PoolBuilder), one runner across shards
    # "replay": a task's first batch straight from the design space, then evolutionary search
    # (pipeline.tuning.ReplayFirst); "evolutionary": MetaSchedule's stock strategy throughout
    first_round: str = "evolutionary"
    # GPU targets: build and measure a task's batch while the next task searches (pipeline/overlap.py;
    # MetaSchedule does the three in turn). Needs the persistent builder.
    overlap: bool = False
    # with overlap: each shard's DLight baselines built and timed on a thread beside the next
    # shard's tuning, behind the device lock (pipeline/baselines.py); false: after its tuning.
    # Off by default: its one H200 run (session 22, 8 workloads x 32, two processes) made 85.5
    # candidates/min against 135.9 / 126.5 inline in session 21, on a call whose start-up also took
    # twice as long; the in-call A/B that would separate the two is still to be run
    baselines_beside: bool = False
    # GPUs measuring at once: one process per entry over alternate shards, builder workers and
    # cores split between them ([]: one process on the default device). A GPU listed twice
    # ([0, 0]) gets two processes whose measurements take turns (pipeline.device_lock): one
    # searches and builds while the other measures
    devices: list[int] = field(default_factory=list)
    # each of those processes on its own share of the cores (and its builder workers with it), or,
    # False, every process on all of them, the OS sharing them: two processes on one GPU can then
    # use the cores the other leaves idle while it waits for its results
    pin_parts: bool = True
    # Compressed copy of every shard kept in git (databases/README.md): a shard is restored
    # from it when it holds more records than work_dir, and re-archived after it is tuned.
    archive_dir: str | None = None
    # "local": measure here (MetaSchedule's LocalRunner); "rpc": measure on the RPC servers
    # registered with TVM's tracker at rpc_tracker ("host:port") under rpc_key (README: cluster)
    runner: str = "local"
    rpc_tracker: str = "127.0.0.1:9190"
    rpc_key: str = "gpu"
    rpc_workers: int = 1             # measurements in flight (one per RPC server is the usual)
    # Dask fan-out of the shards (README: clusters): null = this process (and one per GPU in
    # `devices`); "local" = a local cluster of `cluster_workers` processes; "tcp://host:8786"
    # = a running scheduler whose workers share the work folder
    cluster: str | None = None
    cluster_workers: int = 2

    def __post_init__(self):
        P.require(self.num_workloads > 0, "num_workloads must be > 0")
        P.require(self.trials_per_workload > 0, "trials_per_workload must be > 0")
        P.require(0 < self.trials_per_iter <= self.trials_per_workload,
                  "trials_per_iter must be in 1..trials_per_workload")
        P.require(self.shard_size > 0, "shard_size must be > 0")
        P.require(self.builder_workers > 0, "builder_workers must be > 0")
        P.require(self.population_size >= self.trials_per_iter, "population_size must be >= trials_per_iter")
        P.require(self.init_min_unmeasured >= 1, "init_min_unmeasured must be >= 1")
        P.require(self.max_fail_count >= 1, "max_fail_count must be >= 1")
        unknown = sorted(set(self.families) - set(FAMILIES))
        P.require(not unknown, f"unknown families {unknown}; choose from {sorted(FAMILIES)}")
        P.require(bool(self.families), "families must list at least one family")
        P.require(self.first_round in ("evolutionary", "replay"), "first_round must be 'evolutionary' or 'replay'")
        P.require(self.runner in ("local", "rpc"), "runner must be 'local' or 'rpc'")
        P.require(not self.overlap or self.persistent_builder,
                  "overlap builds in the kept pool of build workers: set persistent_builder: true")
        host, _, port = self.rpc_tracker.rpartition(":")
        P.require(bool(host) and port.isdigit(), f"rpc_tracker must be host:port, got {self.rpc_tracker!r}")
        P.require(self.rpc_workers > 0, "rpc_workers must be > 0")
        cluster.check_address(self.cluster, "search.cluster")
        P.require(self.cluster_workers > 0, "cluster_workers must be > 0")
        P.require(all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in self.devices),
                  "devices must list GPU indices, e.g. [0, 1] (or [0, 0]: two processes sharing GPU 0)")


def select_workloads(p: SearchParams) -> list[Spec]:
    """Round-robin over the families (so a small slice covers them all), keeping workloads
    within the size limits, never a held-out workload."""
    from tvm.s_tir.analysis import estimate_tir_flops

    from pipeline.measure import arg_specs

    held = held_out_hashes()
    by_family: dict[str, list[Spec]] = defaultdict(list)
    for s in catalog(p.seed, p.families):
        by_family[s.family].append(s)

    def eligible(family: str):
        for spec in by_family[family]:
            mod = build(spec)
            elements = sum(math.prod(shape) for shape, _ in arg_specs(mod))
            if (estimate_tir_flops(mod) <= p.max_mflop * 1e6 and elements <= p.max_elements
                    and structural_hash(mod) not in held):
                yield spec

    chosen: list[Spec] = []
    for i, spec in enumerate(_round_robin([eligible(f) for f in p.families])):
        if i < p.offset:
            continue
        chosen.append(spec)
        if len(chosen) == p.num_workloads:
            break
    return chosen


def _round_robin(iterators):
    active = list(iterators)
    while active:
        for it in list(active):
            try:
                yield next(it)
            except StopIteration:
                active.remove(it)


@tvm.ir.utils.derived_object
class _Recorder(ms.measure_callback.PyMeasureCallback):
    """Advances the progress bar and keeps the error message of every failed candidate
    (JSONDatabase keeps only run_secs = 1e10 for them)."""

    def __init__(self, errors_path: str, task_ids: list[str], bar) -> None:
        super().__init__()
        self.errors_path, self.task_ids, self.bar = errors_path, task_ids, bar

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        from pipeline.codec import trace_to_json

        for cand, built, ran in zip(measure_candidates, builder_results, runner_results):
            stage, message = None, None
            if built.error_msg:
                stage, message = "build", built.error_msg
            elif ran.error_msg:    # with overlap, a build's failure arrives as the runner's result
                stage, message = ("build" if overlap.is_build_error(ran.error_msg) else "run"), ran.error_msg
            if stage:
                files.append_jsonl(self.errors_path, {
                    "workload": self.task_ids[task_id], "stage": stage, "error": str(message)[-2000:],
                    "trace": trace_to_json(cand.sch.trace)})
        self.bar.update(len(measure_candidates))


def record_counts(db_dir: Path) -> dict[str, int]:
    """Tuning records per workload hash in a shard's database."""
    counts: dict[str, int] = defaultdict(int)
    for ref in records.scan(db_dir):
        counts[ref.workload_hash] += 1
    return counts


def _tune_shard(p: SearchParams, target, shard_dir: Path, pending: list[tuple[Spec, str, int]], bar,
                pool=None, runner=None) -> Phases:
    ids = [spec.id for spec, _, _ in pending]
    budget = max(r for _, _, r in pending)
    return tuning.tune(p, target, [(spec.id, build(spec)) for spec, _, _ in pending], shard_dir, budget,
                       p.trials_per_iter, callbacks=[_Recorder(str(shard_dir / "errors.jsonl"), ids, bar)],
                       pool=pool, overlap=p.overlap, runner=runner)


def _listed(shard_dir: Path, name: str) -> dict:
    """A shard's list of workloads not to tune again (hash -> why), {} when there is none."""
    path = shard_dir / name
    return json.loads(path.read_text()) if path.exists() else {}


def _failed(shard_dir: Path) -> dict[str, str]:
    return _listed(shard_dir, "failed.json")


def _exhausted(shard_dir: Path) -> dict[str, int]:
    return _listed(shard_dir, "exhausted.json")


def _pending(p: SearchParams, shard_dir: Path, shard: list[Spec], entries: list[dict]):
    """(spec, hash, trials still to measure) of the shard's workloads; a workload whose tuning
    raised inside TVM is not retried (it is in failed.json, with its error), nor one whose
    search ended short of its budget (exhausted.json: the strategy found no new candidate)."""
    counts, skip = record_counts(shard_dir), {**_failed(shard_dir), **_exhausted(shard_dir)}
    return [(s, e["hash"], p.trials_per_workload - counts.get(e["hash"], 0))
            for s, e in zip(shard, entries)
            if counts.get(e["hash"], 0) < p.trials_per_workload and e["hash"] not in skip]


def _mark_exhausted(p: SearchParams, shard_dir: Path, tuned: list[tuple[Spec, str, int]]) -> None:
    """After a tuning run that ended normally, a workload still short of its budget is one
    whose design space MetaSchedule could not sample any further ("Cannot sample enough
    initial population"); retrying it would cost a round on every resume and measure nothing."""
    counts = record_counts(shard_dir)
    short = {h: counts.get(h, 0) for _, h, _ in tuned if counts.get(h, 0) < p.trials_per_workload}
    if short:
        files.write_json(shard_dir / "exhausted.json", {**_exhausted(shard_dir), **short})


def design_space_error(target, spec: Spec) -> str | None:
    """Why MetaSchedule cannot generate the workload's design space on `target` (None if it
    can). Seen on the H200's target: a fused attention_score kernel whose space generator raises
    `IndexError: Index 6 out of bounds 6`; such a workload makes any run it is in raise at once."""
    from pipeline.space import generator

    try:
        ms.TuneContext(mod=build(spec), target=target, space_generator=generator(target),
                       task_name=spec.id).generate_design_space()
    except Exception as err:   # noqa: BLE001 - anything TVM raises is the answer
        return _why(err)
    return None


def _why(err: BaseException) -> str:
    return f"{type(err).__name__}: {last_line(err)}"[:500]


def _list_failed(shard_dir: Path, why: dict[str, str]) -> None:
    files.write_json(shard_dir / "failed.json", {**_failed(shard_dir), **why})


def _tune_group(p: SearchParams, target, shard_dir: Path, group, bar, pool, phases: Phases,
                runner=None) -> str | None:
    """Tune `group` in one run: None, or why TVM raised (the error logged, its time counted apart)."""
    start = time.perf_counter()
    try:
        phases.add(_tune_shard(p, target, shard_dir, group, bar, pool, runner))
        _mark_exhausted(p, shard_dir, group)
        return None
    except Exception as err:   # noqa: BLE001 - anything TVM raises: recorded, never fatal
        phases.failed_run_s += time.perf_counter() - start
        _log_scheduler_error(shard_dir, [spec.id for spec, _, _ in group], err)
        return _why(err)


def tune_shard_safely(p: SearchParams, target, shard_dir: Path, shard: list[Spec], entries: list[dict],
                      bar, pool=None, runner=None) -> Phases:
    """Tune the shard's pending workloads together; if TVM raises (seen on the H200:
    `IndexError: Index 3 out of bounds 3` inside TaskSchedulerTune), keep what was measured and
    log the error. Then the workloads whose design space cannot be generated are listed in
    failed.json and the rest is tuned together again (one such workload had sent its whole
    shard to one-at-a-time tuning, where each task fills and drains the build/measure pipeline
    alone: reports/bench_search_h200_strat.json); if that raises too, the rest is tuned one
    workload at a time, so one bad workload costs only itself. A workload that fails alone
    goes to failed.json. The stage goes on in every case."""
    phases = Phases()
    pending = _pending(p, shard_dir, shard, entries)
    if not pending or _tune_group(p, target, shard_dir, pending, bar, pool, phases, runner) is None:
        return phases
    start = time.perf_counter()
    no_space = {h: why for spec, h, _ in pending if (why := design_space_error(target, spec)) is not None}
    phases.failed_run_s += time.perf_counter() - start
    if no_space:
        _list_failed(shard_dir, no_space)
        rest = _pending(p, shard_dir, shard, entries)
        if not rest or (len(rest) > 1 and _tune_group(p, target, shard_dir, rest, bar, pool, phases, runner) is None):
            return phases
    for one in _pending(p, shard_dir, shard, entries):
        why = _tune_group(p, target, shard_dir, [one], bar, pool, phases, runner)
        if why is not None:
            _list_failed(shard_dir, {one[1]: why})
    return phases


def _log_scheduler_error(shard_dir: Path, workloads: list[str], err: BaseException) -> None:
    files.append_jsonl(shard_dir / "errors.jsonl", {
        "workload": workloads[0] if len(workloads) == 1 else None, "workloads": workloads,
        "stage": "scheduler", "error": f"{type(err).__name__}: {str(err)[-2000:]}", "trace": None})


def summarize_shard(shard_dir: Path) -> list[dict]:
    """Per workload: trials, failures and best latency, from the shard's database."""
    workloads = json.loads((shard_dir / "workloads.json").read_text())
    path = shard_dir / "baselines.json"
    timed = json.loads(path.read_text()) if path.exists() else {}
    stats = {w["hash"]: {"trials": 0, "failed": 0, "best_s": None} for w in workloads}
    for ref in records.scan(shard_dir):
        s = stats.get(ref.workload_hash)
        if s is None:
            continue
        s["trials"] += 1
        if ref.latency_s is None:
            s["failed"] += 1
        elif s["best_s"] is None or ref.latency_s < s["best_s"]:
            s["best_s"] = ref.latency_s
    rows = []
    for w in workloads:
        row = {**w, **stats[w["hash"]], "baseline_s": timed.get(w["id"], {}).get("latency_s")}
        if row["best_s"] and row["baseline_s"]:
            row["speedup"] = row["baseline_s"] / row["best_s"]
        rows.append(row)
    return rows


def _plan(p: SearchParams, specs: list[Spec]) -> list[tuple[Path, list[Spec], list[dict]]]:
    return [_plan_shard(p, specs[i:i + p.shard_size], i // p.shard_size) for i in range(0, len(specs), p.shard_size)]


def _plan_shard(p: SearchParams, shard: list[Spec], index: int) -> tuple[Path, list[Spec], list[dict]]:
    shard_dir = Path(p.work_dir) / f"shard-{index:04d}"
    shard_dir.mkdir(parents=True, exist_ok=True)
    if p.archive_dir:
        archive.restore(shard_dir, Path(p.archive_dir))
    records.repair(shard_dir)   # a killed run may have left half a record: TVM would refuse the file
    entries = [{**s.to_json(), "hash": structural_hash(build(s)), "target": p.target} for s in shard]
    files.write_json(shard_dir / "workloads.json", entries)
    return shard_dir, shard, entries


def _remaining(p: SearchParams, plan) -> int:
    return sum(r for shard_dir, shard, entries in plan for _, _, r in _pending(p, shard_dir, shard, entries))


def _run_shards(p: SearchParams, plan, progress: bool, part: str = "", position: int = 0,
                deadline: float | None = None) -> Phases:
    """Tune the shards in order, then time each workload's baseline; every shard's phases go
    to `<work_dir>/throughput.jsonl` (the campaign's running log of where the time went)."""
    target = make_target(p.target)
    phases = Phases()
    # one pool of build workers for all the shards (started once, recycled every 16 rounds)
    kind = overlap.OverlapBuilder if p.overlap else tuning.PoolBuilder
    pool = kind(p.builder_workers, p.build_timeout_s, Phases()) if p.persistent_builder else None
    if pool is not None:
        pool.warm()        # its workers start (TVM imports) beside the runner's start and the first shard's search
    # and one runner: TVM's LocalRunner starts its measuring worker (a process importing TVM) when it
    # is made, 5-7 s on 2 cores; made for each shard, that went between the shards, untimed (8-12 s a
    # shard of the H100 campaign step of session 33). MetaSchedule's own Relax tuning keeps one too.
    runner = tuning.make_runner(p) if p.persistent_builder else None
    bar = tqdm(total=_remaining(p, plan), desc=f"search{part}", unit="trial", disable=not progress,
               position=position, dynamic_ncols=True)
    # overlapped, a shard's DLight baselines are built and timed beside the next shard's tuning
    lock = Path(p.work_dir).resolve() / f".baselines-{os.getpid()}.lock"
    with baselines.Timer(target, beside=p.overlap and p.baselines_beside, lock_path=lock) as timer:
        try:
            for shard_dir, shard, entries in plan:
                if deadline is not None and time.time() > deadline:
                    break          # --stop-after: the next run resumes here
                bar.set_postfix_str(shard_dir.name)
                save = (lambda d=shard_dir: archive.save(d, Path(p.archive_dir))) if p.archive_dir else None
                cpu = hostcpu.sample()     # the machine's busy cores over the shard (builds are CPU-bound)
                try:
                    done = tune_shard_safely(p, target, shard_dir, shard, entries, bar, pool, runner)
                except KeyboardInterrupt:      # Ctrl-C, `timeout -s INT`: what the shard in flight measured is kept
                    if save:
                        save()
                    raise
                if save:
                    save()         # the databases kept before the baselines are timed
                done.baseline_s = timer.submit(shard_dir, shard, then=save)
                if done.candidates:
                    phases.add(done)
                    files.append_jsonl(Path(p.work_dir) / "throughput.jsonl", {
                        "shard": shard_dir.name, "part": part.strip(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                        "builder_workers": p.builder_workers, "persistent_builder": p.persistent_builder,
                        "population_size": p.population_size, "genetic_num_iters": p.genetic_num_iters,
                        "init_min_unmeasured": p.init_min_unmeasured, "max_fail_count": p.max_fail_count,
                        "first_round": p.first_round,
                        "overlap": p.overlap, "baselines_beside": timer.beside,
                        "trials_per_iter": p.trials_per_iter, "cores_busy": hostcpu.cores_busy(cpu),
                        "host_cpus": os.cpu_count(), **done.to_json()})
        finally:
            bar.close()
            if pool is not None:
                pool.shutdown()
            if getattr(runner, "pool", None) is not None:
                runner.pool.shutdown()     # its measuring worker, now rather than when garbage-collected
        phases.baseline_s += timer.wait()     # beside: only what the last shard's baselines kept us waiting
        phases.baseline_beside_s = timer.background_s
    return phases


def _run_part(p: SearchParams, plan, k: int, n: int, device: int, progress: bool, deadline: float | None) -> None:
    """One of n processes, each measuring on its own GPU (set before CUDA starts in this
    process and the runner's workers) and building with its share of the workers; `plan`
    is this part's slice of the parent's plan."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    label = f" gpu{device}"
    if p.devices.count(device) > 1:     # a shared GPU: measurements take turns
        os.environ[device_lock.ENV] = str(Path(p.work_dir).resolve() / f".device-{device}.lock")
        label += f".{p.devices[:k].count(device)}"
    cpus = sorted(os.sched_getaffinity(0))
    if p.pin_parts:
        cpus = part_cpus(cpus, k, n)
        os.sched_setaffinity(0, cpus)  # inherited by the build workers: one GPU, its share of cores
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    p = dataclasses.replace(p, builder_workers=max(1, p.builder_workers // n))
    phases = _run_shards(p, plan, progress, part=label, position=k, deadline=deadline)
    files.write_json(Path(p.work_dir) / f".part-{k}.json", {**phases.to_json(), "cpus": len(cpus)})


def part_cpus(cpus: list[int], k: int, n: int) -> list[int]:
    """Part k of n gets its own contiguous share of the usable cores (at least one), so a
    part's candidates per minute is what one GPU with that many cores does alone."""
    lo, hi = k * len(cpus) // n, (k + 1) * len(cpus) // n
    return cpus[lo:hi] or [cpus[k % len(cpus)]]


def run_search(p: SearchParams, progress: bool = True, stop_after: float | None = None) -> dict:
    work = Path(p.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    specs = select_workloads(p)
    if not specs:
        raise P.ParamsError(f"no workload of {p.families} fits max_mflop={p.max_mflop} and "
                            f"max_elements={p.max_elements}; raise the limits or add families")
    plan = _plan(p, specs)
    before = sum(sum(record_counts(d).values()) for d, _, _ in plan)
    start, cpu = time.perf_counter(), hostcpu.sample()
    deadline = time.time() + stop_after if stop_after else None
    interrupted = False
    try:
        if p.cluster:
            parts = run_on_cluster(p, plan, progress, deadline=deadline)
        elif len(p.devices) > 1:
            parts = _run_parts(p, plan, progress, deadline)
        else:
            if p.devices:
                os.environ["CUDA_VISIBLE_DEVICES"] = str(p.devices[0])
            parts = [_run_shards(p, plan, progress, deadline=deadline).to_json()]
    except KeyboardInterrupt:
        # interrupted: the report and the archive's run line are still written (what was measured, on
        # which machine), then the interrupt goes on; the next run resumes from the databases
        interrupted, parts = True, []
    seconds, cores_busy = time.perf_counter() - start, hostcpu.cores_busy(cpu)
    measured = sum(sum(record_counts(d).values()) for d, _, _ in plan) - before
    rows = [r for shard_dir, _, _ in plan for r in summarize_shard(shard_dir)]
    speedups = [r["speedup"] for r in rows if r.get("speedup")]
    summary = {
        "target": p.target,
        "workloads": len(rows),
        "families": sorted({r["family"] for r in rows}),
        "trials": sum(r["trials"] for r in rows),
        "failed_trials": sum(r["failed"] for r in rows),
        "failed_workloads": {k: v for d, _, _ in plan for k, v in _failed(d).items()},
        "exhausted_workloads": {k: v for d, _, _ in plan for k, v in _exhausted(d).items()},
        "speedup_geomean_vs_baseline": geomean(speedups),
        "this_run": {"measured": measured, "seconds": round(seconds, 1),
                     "candidates_per_min": round(60 * measured / seconds, 1) if measured else None,
                     "cores_busy": cores_busy, "host_cpus": os.cpu_count(),
                     "devices": p.devices, "builder_workers": p.builder_workers,
                     "persistent_builder": p.persistent_builder, "overlap": p.overlap,
                     "baselines_beside": p.overlap and p.baselines_beside, "remaining_trials": _remaining(p, plan),
                     **({"interrupted": True} if interrupted else {}), "parts": parts},
        "per_workload": rows,
    }
    files.write_json(p.report, summary)
    if p.archive_dir and measured:
        archive.log_run(Path(p.archive_dir), {k: v for k, v in summary["this_run"].items() if k != "parts"},
                        totals={k: summary[k] for k in ("workloads", "trials", "failed_trials")})
    if interrupted:
        raise KeyboardInterrupt
    return summary


def run_on_cluster(p: SearchParams, plan, progress: bool = True, on_client=None,
                   deadline: float | None = None) -> list[dict]:
    """Every shard with trials still to measure, as one job on the Dask cluster (`cluster`:
    "local" for a local cluster of `cluster_workers` processes, or a scheduler's address; the
    work folder must be shared). A job whose worker is lost runs again elsewhere and resumes
    the shard's database: records measured before the loss are kept and not measured again.
    A job that starts past `deadline` (--stop-after, by the worker's clock) leaves its shard."""
    from tqdm import tqdm

    jobs = [(p, index, shard, deadline) for index, (shard_dir, shard, entries) in enumerate(plan)
            if _pending(p, shard_dir, shard, entries)]
    bar = tqdm(total=len(jobs), desc="search shards", unit="shard", disable=not progress)
    out = cluster.run(_cluster_job, jobs, address=p.cluster, workers=p.cluster_workers,
                      on_result=lambda _: bar.update(1), on_client=on_client)
    bar.close()
    return sorted(out, key=lambda r: r["shard"])


def _cluster_job(p: SearchParams, index: int, shard: list[Spec], deadline: float | None = None) -> dict:
    if deadline is not None and time.time() > deadline:
        return {"shard": f"shard-{index:04d}", "skipped": "past --stop-after"}
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    item = _plan_shard(p, shard, index)
    phases = _run_shards(p, [item], progress=False, part=f" dask{os.getpid()}")
    return {"shard": item[0].name, "worker_pid": os.getpid(), **phases.to_json()}


def _run_parts(p: SearchParams, plan, progress: bool, deadline: float | None) -> list[dict]:
    """One process per `devices` entry over alternate shards; a part that dies loses only its shard in
    flight (the databases are resumable), and the stage reports it after the others finish."""
    ctx = multiprocessing.get_context("spawn")
    n = len(p.devices)
    procs = [ctx.Process(target=_run_part, args=(p, plan[k::n], k, n, d, progress, deadline))
             for k, d in enumerate(p.devices)]
    for proc in procs:
        proc.start()
    try:
        for proc in procs:
            proc.join()
    except KeyboardInterrupt:     # the parts got it too (one process group): each keeps its shard in flight
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
        raise
    bad = [(d, proc.exitcode) for d, proc in zip(p.devices, procs) if proc.exitcode != 0]
    if bad:
        raise RuntimeError(f"search parts failed (GPU, exit code): {bad}; rerun to resume")
    out = []
    for k in range(n):
        path = Path(p.work_dir) / f".part-{k}.json"
        out.append({"device": p.devices[k], **json.loads(path.read_text())})
        path.unlink()
    return out


def _times(x: float | None) -> str:
    return "n/a (no correct candidate)" if x is None else f"{x:.2f}x"


def main(params_path: str = "params.yaml", progress: bool = True, stop_after: float | None = None,
         cluster: str | None = None) -> dict:
    p = P.load("search", SearchParams, params_path)
    if cluster:
        p = P.from_dict(SearchParams, {**dataclasses.asdict(p), "cluster": cluster}, "search")
    summary = run_search(p, progress, stop_after)
    run = summary["this_run"]
    print(f"search: {summary['workloads']} workloads, {summary['trials']} trials "
          f"({summary['failed_trials']} failed), geomean speedup over baseline {_times(summary['speedup_geomean_vs_baseline'])}"
          f" -> {p.work_dir}, {p.report}; "
          f"this run {run['measured']} candidates in {run['seconds']:.0f} s "
          f"({run['candidates_per_min'] or 0:.0f}/min)")
    return summary
