"""Stage 1, search: MetaSchedule tuning over a slice of the catalog (LLVM on the CPU default,
CUDA in the GPU profile); every candidate kept.

    little-dragon search [--params params.yaml]

Writes `data/search/shard-NNNN/` (one MetaSchedule JSONDatabase per shard of workloads, plus
`workloads.json`, `baselines.json` and `errors.jsonl`) and `reports/search.json`.

Resumable: a workload whose database already holds its trial budget is skipped, and
JSONDatabase appends each measured candidate as it comes, so an interrupted run loses at
most the candidates in flight. A candidate that fails to build or run is data: MetaSchedule
stores it with run_secs 1e10 and its error message goes to `errors.jsonl`.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from pipeline import files, params as P, records
from pipeline.measure import measure_baseline
from pipeline.tvm_env import make_target, ms, structural_hash, tvm, worker_init
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
    work_dir: str = "data/search"
    report: str = "reports/search.json"
    offset: int = 0                  # skip this many eligible workloads (held-out splits, sharding across machines)

    def __post_init__(self):
        P.require(self.num_workloads > 0, "num_workloads must be > 0")
        P.require(self.trials_per_workload > 0, "trials_per_workload must be > 0")
        P.require(0 < self.trials_per_iter <= self.trials_per_workload,
                  "trials_per_iter must be in 1..trials_per_workload")
        P.require(self.shard_size > 0, "shard_size must be > 0")
        P.require(self.builder_workers > 0, "builder_workers must be > 0")
        P.require(self.population_size >= self.trials_per_iter, "population_size must be >= trials_per_iter")
        unknown = sorted(set(self.families) - set(FAMILIES))
        P.require(not unknown, f"unknown families {unknown}; choose from {sorted(FAMILIES)}")
        P.require(bool(self.families), "families must list at least one family")


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
            elif ran.error_msg:
                stage, message = "run", ran.error_msg
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


def tune(p: SearchParams, target, mods: list[tuple[str, "tvm.IRModule"]], work_dir: Path, budget: int,
         trials_per_iter: int, callbacks=(), logger: str = "search") -> None:
    """MetaSchedule tuning with this stage's settings (evolutionary search, local builder and
    runner with the worker initializer, round-robin over the tasks), recorded in a
    JSONDatabase in `work_dir`. The evaluation stage tunes its yardstick with it too."""
    tasks = [ms.TuneContext(
        mod=mod, target=target, space_generator="post-order-apply",
        search_strategy=ms.search_strategy.EvolutionarySearch(
            population_size=p.population_size, genetic_num_iters=p.genetic_num_iters),
        task_name=name, rand_state=p.seed, num_threads=p.builder_workers,
        logger=ms.logging.get_logger(f"little_dragon.{logger}.{name}")).clone() for name, mod in mods]
    ms.tune.tune_tasks(
        tasks=tasks, task_weights=[1.0] * len(tasks), work_dir=str(work_dir),
        max_trials_global=budget * len(tasks), max_trials_per_task=budget,
        num_trials_per_iter=trials_per_iter,
        builder=ms.builder.LocalBuilder(max_workers=p.builder_workers, timeout_sec=p.build_timeout_s,
                                        initializer=worker_init),
        runner=ms.runner.LocalRunner(
            timeout_sec=p.run_timeout_s, initializer=worker_init,
            evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=p.min_repeat_ms)),
        database=ms.database.JSONDatabase(work_dir=str(work_dir)),
        measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), *callbacks],
        task_scheduler="round-robin",
    )


def _tune_shard(p: SearchParams, target, shard_dir: Path, pending: list[tuple[Spec, str, int]], bar) -> None:
    ids = [spec.id for spec, _, _ in pending]
    budget = max(r for _, _, r in pending)
    tune(p, target, [(spec.id, build(spec)) for spec, _, _ in pending], shard_dir, budget, p.trials_per_iter,
         callbacks=[_Recorder(str(shard_dir / "errors.jsonl"), ids, bar)])


def summarize_shard(shard_dir: Path) -> list[dict]:
    """Per workload: trials, failures and best latency, from the shard's database."""
    workloads = json.loads((shard_dir / "workloads.json").read_text())
    baselines = json.loads((shard_dir / "baselines.json").read_text()) if (shard_dir / "baselines.json").exists() else {}
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
        row = {**w, **stats[w["hash"]], "baseline_s": baselines.get(w["id"], {}).get("latency_s")}
        if row["best_s"] and row["baseline_s"]:
            row["speedup"] = row["baseline_s"] / row["best_s"]
        rows.append(row)
    return rows


def run_search(p: SearchParams, progress: bool = True) -> dict:
    target = make_target(p.target)
    work = Path(p.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    specs = select_workloads(p)
    if not specs:
        raise P.ParamsError(f"no workload of {p.families} fits max_mflop={p.max_mflop} and "
                            f"max_elements={p.max_elements}; raise the limits or add families")
    shards = [specs[i:i + p.shard_size] for i in range(0, len(specs), p.shard_size)]
    plan = []
    for i, shard in enumerate(shards):
        shard_dir = work / f"shard-{i:04d}"
        shard_dir.mkdir(exist_ok=True)
        records.repair(shard_dir)   # a killed run may have left half a record: TVM would refuse the file
        entries = [{**s.to_json(), "hash": structural_hash(build(s)), "target": p.target} for s in shard]
        files.write_json(shard_dir / "workloads.json", entries)
        counts = record_counts(shard_dir)
        pending = [(s, e["hash"], p.trials_per_workload - counts.get(e["hash"], 0))
                   for s, e in zip(shard, entries) if counts.get(e["hash"], 0) < p.trials_per_workload]
        plan.append((shard_dir, shard, pending))
    total = sum(r for _, _, pending in plan for _, _, r in pending)
    bar = tqdm(total=total, desc=f"search {len(specs)} workloads", unit="trial", disable=not progress)
    for shard_dir, shard, pending in plan:
        if pending:
            bar.set_postfix_str(shard_dir.name)
            _tune_shard(p, target, shard_dir, pending, bar)
        baselines_path = shard_dir / "baselines.json"
        baselines = json.loads(baselines_path.read_text()) if baselines_path.exists() else {}
        for spec in shard:
            if spec.id not in baselines:
                t = measure_baseline(build(spec), target)
                baselines[spec.id] = {"latency_s": t.latency_s, "error": t.error}
        files.write_json(baselines_path, baselines)
    bar.close()
    rows = [r for shard_dir, _, _ in plan for r in summarize_shard(shard_dir)]
    speedups = [r["speedup"] for r in rows if r.get("speedup")]
    summary = {
        "target": p.target,
        "workloads": len(rows),
        "families": sorted({r["family"] for r in rows}),
        "trials": sum(r["trials"] for r in rows),
        "failed_trials": sum(r["failed"] for r in rows),
        "speedup_geomean_vs_baseline": math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None,
        "per_workload": rows,
    }
    files.write_json(p.report, summary)
    return summary


def main(params_path: str = "params.yaml", progress: bool = True) -> dict:
    p = P.load("search", SearchParams, params_path)
    summary = run_search(p, progress)
    print(f"search: {summary['workloads']} workloads, {summary['trials']} trials "
          f"({summary['failed_trials']} failed), geomean speedup over baseline "
          f"{summary['speedup_geomean_vs_baseline'] or float('nan'):.2f}x -> {p.work_dir}, {p.report}")
    return summary
