"""`little-dragon tune KERNEL --strategy ms-cost`: MetaSchedule's own evolutionary search, its
population ranked by the project's cost model pre-trained on the target's search campaign.

In the benchmarks against MetaSchedule at equal measured candidates (pipeline.bench.tune, its
`ms_cost` contender; README, issue #15) this has been the strongest way to spend a small budget:
with 16 candidates it reached MetaSchedule's best of 64 on 20 of 32 CPU kernel runs, against 12
of 32 for MetaSchedule's own first 16, and on 5 of 7 CUDA kernels. It needs no language model.
The settings are the benchmark's: rounds of `batch` (8) candidates, each retraining the cost
model on the campaign plus this kernel's measurements counted `focus` (16) times, population
512 x 4 generations.

Every candidate is in the work folder's MetaSchedule `JSONDatabase`, as MetaSchedule measured it
(its runner times; it does not compare outputs). The fastest few are then checked and timed
by the project's checker (pipeline.verify: built, run, compared with the unscheduled kernel,
timed, as `optimize` and the model's `tune` do), and `best.script` is the fastest one that
passed: these checks time candidates already measured, they add none. `tune.jsonl` lists
the candidates in measurement order. Resumable: a second run in the same work folder measures
only what is left of `--trials`, its cost model taking in what was measured before.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from pipeline import files
from pipeline.optimize import KernelError
from pipeline.tune import TuneResult

SOURCE = "metaschedule + pre-trained cost model"


def tune(kernel_path: str, target_spec, trials: int, work_dir: str, batch: int = 8, focus: int = 16,
         cost_data: str | None = None, verify_top: int = 4, timeout_s: float = 60.0, progress: bool = True,
         params_path: str = "params.yaml", population: int = 512, generations: int = 4) -> TuneResult:
    """Tune the kernel in `kernel_path` to `trials` measured candidates in `work_dir`."""
    from pipeline import cost_model, params as P, records, tuning
    from pipeline.optimize import load_kernel
    from pipeline.stages.search import SearchParams
    from pipeline.tune import check_cost_args
    from pipeline.tvm_env import make_target, ms
    from pipeline.verify import Checker

    if trials < 1:
        raise KernelError(f"--trials must be >= 1, got {trials}")
    if batch < 1 or focus < 1 or verify_top < 1:
        raise KernelError(f"--batch, --focus and the checks of the best must be >= 1 (got {batch}, {focus}, {verify_top})")
    check_cost_args(1, cost_data)
    target = make_target(target_spec)
    mod = load_kernel(kernel_path)
    work = Path(work_dir)
    log = work / "tune.jsonl"
    other = {r.get("source") for r in files.read_jsonl(log)} - {SOURCE} if log.exists() else set()
    if other:
        raise KernelError(f"{work}: holds a tune by another strategy ({', '.join(sorted(map(str, other)))}); "
                          f"use another --work-dir")
    work.mkdir(parents=True, exist_ok=True)
    records.repair(work)     # an interrupted run may have left half a record
    sp = dataclasses.replace(P.load("search", SearchParams, params_path), population_size=population,
                             genetic_num_iters=generations, trials_per_iter=batch)
    start = time.perf_counter()
    before = _candidates(mod, work)
    cost, source = cost_model.for_target(target_spec, cost_data, progress=progress)
    if before:      # a resumed run: what it measured already, as the measurements it counted then
        cost.add(mod, [s for s, _ in before if s], [lat for s, lat in before if s])
    left = trials - len(before)
    if left > 0:
        if progress:
            print(f"tune: {left} candidates to measure ({len(before)} already in {work}); "
                  f"cost model pre-trained on {source}", flush=True)
        strategy = ms.search_strategy.EvolutionarySearch(population_size=population, genetic_num_iters=generations)
        tuning.tune(sp, target, [("main", mod)], work, left, min(batch, left), logger="tune",
                    search_strategy=strategy, cost_model=cost.as_metaschedule(focus))
    found = _candidates(mod, work)
    result = TuneResult(cost_data=source)
    best = None
    for _, lat in found:
        best = lat if lat is not None and (best is None or lat < best) else best
        result.curve.append(best)
    files.write_jsonl(log, ({"script": script, "round": i // batch + 1, "source": SOURCE, "latency_s": lat,
                             "timed_by": "metaschedule"} for i, (script, lat) in enumerate(found)))  # the database is the record
    result.measured, result.rounds = len(found), (len(found) + batch - 1) // batch
    result.correct = sum(lat is not None for _, lat in found)    # MetaSchedule ran them; the checker checks the best
    checked = _check_best(mod, target_spec, found, verify_top, Checker(timeout_s=timeout_s, workers=2))
    ok = [c for c in checked if c["correct"]]
    if ok:
        top = min(ok, key=lambda c: c["latency_s"])
        result.best_latency_s, result.baseline_s, result.best_script = top["latency_s"], top["baseline_s"], top["script"]
        files.write_text_atomic(work / "best.script", top["script"] + "\n")
    elif not checked:
        result.stopped = "no candidate ran"
    else:
        result.stopped = f"none of the {len(checked)} fastest passed the checker"
    result.seconds = time.perf_counter() - start
    files.write_json(work / "result.json", {**result.to_json(), "strategy": "ms-cost", "focus": focus,
                                            "batch": batch, "search": [population, generations],
                                            "checked": [{k: v for k, v in c.items() if k != "script"} | {"rank": i}
                                                        for i, c in enumerate(checked)]})
    return result


def _candidates(mod, work: Path) -> list[tuple[str | None, float | None]]:
    """(script, MetaSchedule's latency or None) of each record of `mod` in the work folder's
    database, in measurement order (script None: a trace the codec does not encode)."""
    from pipeline import metaschedule, records
    from pipeline.tvm_env import structural_hash

    if not (work / "database_tuning_record.json").exists():
        return []
    key = structural_hash(mod)
    if key not in records.workload_hashes(work):
        return []
    tuned = metaschedule._read(mod, work, 0.0)
    refs = list(records.scan(work))
    return [(s, lat) for s, lat, ref in zip(tuned.scripts, tuned.ms_latency_s, refs) if ref.workload_hash == key]


def _check_best(mod, target_spec, found, top: int, checker) -> list[dict]:
    """The `top` fastest distinct candidates by MetaSchedule's timing, checked and timed again."""
    ranked = sorted({s: lat for s, lat in found if s and lat is not None}.items(), key=lambda x: x[1])[:top]
    scripts = [s for s, _ in ranked]
    outcomes = checker.check_many(mod, scripts, target_spec, timed=True) if scripts else []
    return [{"script": s, "metaschedule_latency_s": lat, "correct": o.correct, "stage": o.stage, "error": o.error,
             "latency_s": o.latency_s if o.correct else None, "baseline_s": o.baseline_s}
            for (s, lat), o in zip(ranked, outcomes)]


def main_summary(r: TuneResult, work_dir: str) -> str:
    if not r.best_latency_s:
        return f"tune (ms-cost): {r.measured} candidates measured, {r.stopped}; database in {work_dir}"
    return (f"tune (ms-cost): {r.measured} candidates measured by MetaSchedule with a cost model pre-trained on "
            f"{r.cost_data}, {r.seconds:.0f} s; best checked {r.best_latency_s * 1e6:.1f} us ({r.speedup:.2f}x the "
            f"baseline) -> {work_dir}/best.script, MetaSchedule database in {work_dir}")
