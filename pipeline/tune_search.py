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
only what is left of `--trials`, its cost model taking in what was measured before, and its
search skipping those candidates (`SkipMeasured`: MetaSchedule would measure them again).
`tune-model --strategy ms-cost` runs `tune_kernel` on each task of a network.

`--strategy ms-rank` is the same search ranked by pipeline.rank_model instead (XGBoost pairwise
ranking per workload on the same campaign data, learning from the run the same way): better at
ordering held-out workloads' candidates (bench cost_model --model rank), and the `ms_rank`
contender of the tune benchmark.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from pipeline import files
from pipeline.optimize import KernelError
from pipeline.tune import TuneResult
from pipeline.tvm_env import make_target, ms, structural_hash, tvm

SOURCE = "metaschedule + pre-trained cost model"
FOCUS = 16  # times the cost model counts this kernel's measurements against the campaign's


def tune(kernel_path: str, target_spec, trials: int, work_dir: str, batch: int = 8, focus: int = FOCUS,
         cost_data: str | None = None, verify_top: int = 4, timeout_s: float = 60.0, progress: bool = True,
         params_path: str = "params.yaml", ranker: bool = False) -> TuneResult:
    """Tune the kernel in `kernel_path` to `trials` measured candidates in `work_dir` (`ranker`:
    the search ranks by pipeline.rank_model, `--strategy ms-rank`)."""
    from pipeline import cost_model
    from pipeline.optimize import load_kernel
    from pipeline.verify import Checker

    check_args(trials, batch, focus, cost_data)
    make_target(target_spec)          # a bad target fails here, before the cost model loads
    check_work(work_dir)
    mod = load_kernel(kernel_path)
    sp = search_params(params_path, batch)
    cost, source = cost_model.for_target(target_spec, cost_data, progress=progress)
    checker = Checker(timeout_s=timeout_s, workers=2)
    try:
        return tune_kernel(mod, target_spec, trials, work_dir, cost, source, sp, focus, verify_top, checker, progress,
                           ranker)
    finally:
        checker.close()


def check_args(trials: int, batch: int, focus: int, cost_data: str | None, what: str = "--trials") -> None:
    """Bad numbers, a cost-data folder that is not a search folder: one-line errors before anything loads."""
    from pipeline.tune import check_cost_args

    if trials < 1:
        raise KernelError(f"{what} must be >= 1, got {trials}")
    if batch < 1 or focus < 1:
        raise KernelError(f"--batch and --focus must be >= 1 (got {batch}, {focus})")
    check_cost_args(1, cost_data)


def check_work(work_dir) -> Path:
    """The work folder, unless it holds a tune by the model's strategy (whose tune.jsonl this
    one would rewrite)."""
    work = Path(work_dir)
    log = work / "tune.jsonl"
    other = {r.get("source") for r in files.read_jsonl(log)} - {SOURCE} if log.exists() else set()
    if other:
        raise KernelError(f"{work}: holds a tune by another strategy ({', '.join(sorted(map(str, other)))}); "
                          f"use another --work-dir")
    return work


def search_params(params_path: str, batch: int, population: int = 512, generations: int = 4):
    """The search stage's settings (builders, timeouts) with the benchmark's search: `batch`
    candidates a round, population 512 x 4 generations (MetaSchedule's defaults)."""
    from pipeline import params as P
    from pipeline.stages.search import SearchParams

    return dataclasses.replace(P.load("search", SearchParams, params_path), population_size=population,
                               genetic_num_iters=generations, trials_per_iter=batch)


def tune_kernel(mod, target_spec, trials: int, work_dir, cost, source: str, sp, focus: int = FOCUS,
                verify_top: int = 4, checker=None, progress: bool = True, ranker: bool = False) -> TuneResult:
    """One kernel to `trials` candidates in `work_dir`. `cost`: a pipeline.cost_model.CostModel
    (pre-trained; it takes in this kernel's measurements, so a network's tasks can share one);
    `sp`: `search_params`. `verify_top` 0: no checks, the best is MetaSchedule's fastest as it
    timed it (a network's tasks, whose compiled network is checked end to end instead).
    `ranker`: MetaSchedule's search ranks by a pipeline.rank_model.RankModel on `cost`'s data."""
    from pipeline import records, tuning

    target = make_target(target_spec)
    work = check_work(work_dir)
    log = work / "tune.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    records.repair(work)     # an interrupted run may have left half a record
    start = time.perf_counter()
    before = _candidates(mod, work)
    if before:      # a resumed run: what it measured already, as the measurements it counted then
        cost.add(mod, [s for s, _ in before if s], [lat for s, lat in before if s])
    left = trials - len(before)
    if left > 0:
        if progress:
            print(f"tune: {left} candidates to measure ({len(before)} already in {work}); "
                  f"{'ranking' if ranker else 'cost'} model pre-trained on {source}", flush=True)
        strategy = SkipMeasured(sp.population_size, sp.genetic_num_iters,
                                _measured_mods(mod, target, [s for s, _ in before if s]))
        from pipeline.rank_model import for_search

        xgb = for_search(cost, focus, ranker)
        tuning.tune(sp, target, [("main", mod)], work, left, min(sp.trials_per_iter, left), logger="tune",
                    search_strategy=strategy, cost_model=xgb)
    found = _candidates(mod, work)
    if left > 0:    # the run's measurements into the project's model too, for a network's next task
        new = found[len(before):]
        cost.add(mod, [s for s, _ in new if s], [lat for s, lat in new if s], train=False)
    result = TuneResult(cost_data=source)
    best = None
    for _, lat in found:
        best = lat if lat is not None and (best is None or lat < best) else best
        result.curve.append(best)
    batch = sp.trials_per_iter
    files.write_jsonl(log, ({"script": script, "round": i // batch + 1, "source": SOURCE, "latency_s": lat,
                             "timed_by": "metaschedule"} for i, (script, lat) in enumerate(found)))  # the database is the record
    result.measured, result.rounds = len(found), (len(found) + batch - 1) // batch
    result.correct = sum(lat is not None for _, lat in found)    # MetaSchedule ran them; the checker checks the best
    checked = _check_best(mod, target_spec, found, verify_top, checker) if verify_top > 0 else []
    ok = [c for c in checked if c["correct"]]
    if ok:
        top = min(ok, key=lambda c: c["latency_s"])
        result.best_latency_s, result.baseline_s, result.best_script = top["latency_s"], top["baseline_s"], top["script"]
    elif verify_top == 0 and best is not None:
        result.best_latency_s = best
        result.best_script = next(s for s, lat in found if lat == best)
    elif not checked:
        result.stopped = "no candidate ran"
    else:
        result.stopped = f"none of the {len(checked)} fastest passed the checker"
    if result.best_script:
        files.write_text_atomic(work / "best.script", result.best_script + "\n")
    result.seconds = time.perf_counter() - start
    files.write_json(work / "result.json", {**result.to_json(), "strategy": strategy_name(ranker), "focus": focus,
                                            "batch": batch, "search": [sp.population_size, sp.genetic_num_iters],
                                            "checked": [{k: v for k, v in c.items() if k != "script"} | {"rank": i}
                                                        for i, c in enumerate(checked)]})
    return result


def strategy_name(ranker: bool) -> str:
    return "ms-rank" if ranker else "ms-cost"


def _measured_mods(mod, target, scripts: list[str]) -> set:
    """Structural hashes of the scheduled kernels of `scripts` (those measured before)."""
    from pipeline import codec
    from pipeline.tvm_env import TVM_ERRORS, Schedule

    out = set()
    for script in scripts:
        try:
            sch = Schedule(mod, debug_mask=0)
            codec.decode(mod, script, target).apply_to_schedule(sch, remove_postproc=False)
        except (codec.DecodeError, *TVM_ERRORS):
            continue
        out.add(structural_hash(sch.mod))
    return out


@tvm.ir.utils.derived_object
class SkipMeasured(ms.search_strategy.PySearchStrategy):
    """MetaSchedule's evolutionary search, minus the candidates measured before this run: it does
    not read those from the database (TVM: "TODO: add records from the database to avoid
    re-measuring"), so a resumed tune measured them again. `measured`: structural hashes of
    their scheduled kernels (`_measured_mods`)."""

    def __init__(self, population_size: int, genetic_num_iters: int, measured: set, tries: int = 3) -> None:
        super().__init__()
        self.args = (population_size, genetic_num_iters, set(measured), tries)
        # the inner search marks what it picks as measured, so each round of re-measures uses up at least
        # one of the candidates measured before: as many rounds as those, plus `tries`, get past them all
        self.measured, self.tries = set(measured), tries + len(measured)
        self.left = 0                # candidates still to send: pre_tuning's max_trials
        self.inner = ms.search_strategy.EvolutionarySearch(population_size=population_size,
                                                           genetic_num_iters=genetic_num_iters)

    def _initialize_with_tune_context(self, context) -> None:
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None) -> None:
        self.left = max_trials      # the inner search's count drifts after a round of re-measures: ours does not
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self):
        # a round of re-measures only: the search is told none ran, and tries again (a pre-trained model
        # ranks the kernel's measured best first, round after round: the ranking model did)
        for _ in range(self.tries):
            if self.left <= 0:
                return None
            cands = self.inner.generate_measure_candidates()
            if cands is None:
                return None
            hashes = [structural_hash(c.sch.mod) for c in cands]
            fresh = [(c, h) for c, h in zip(cands, hashes) if h not in self.measured][: self.left]
            if fresh:
                self.measured.update(h for _, h in fresh)
                self.left -= len(fresh)
                return [c for c, _ in fresh]
            self.inner.notify_runner_results([], [])
        return None

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.inner.notify_runner_results(measure_candidates, results)

    def clone(self):
        return SkipMeasured(*self.args)


def _candidates(mod, work: Path) -> list[tuple[str | None, float | None]]:
    """(script, MetaSchedule's latency or None) of each record of `mod` in the work folder's
    database, in measurement order (script None: a trace the codec does not encode)."""
    from pipeline import metaschedule, records

    if not (work / "database_tuning_record.json").exists():
        return []
    key = structural_hash(mod)
    if key not in records.workload_hashes(work):
        return []
    tuned = metaschedule._read(mod, work, 0.0)
    refs = list(records.scan(work))
    return [(s, lat) for s, lat, ref in zip(tuned.scripts, tuned.ms_latency_s, refs) if ref.workload_hash == key]


def _check_best(mod, target_spec, found, top: int, checker) -> list[dict]:
    """The `top` fastest distinct candidates by MetaSchedule's timing, checked and timed again (on
    a CPU one at a time, no build beside a timing: `Checker.alone`)."""
    ranked = sorted({s: lat for s, lat in found if s and lat is not None}.items(), key=lambda x: x[1])[:top]
    scripts = [s for s, _ in ranked]
    with checker.alone_on_cpu(target_spec):
        outcomes = checker.check_many(mod, scripts, target_spec, timed=True) if scripts else []
    return [{"script": s, "metaschedule_latency_s": lat, "correct": o.correct, "stage": o.stage, "error": o.error,
             "latency_s": o.latency_s if o.correct else None, "baseline_s": o.baseline_s}
            for (s, lat), o in zip(ranked, outcomes)]


def main_summary(r: TuneResult, work_dir: str, ranker: bool = False) -> str:
    how, what = strategy_name(ranker), "a ranking model" if ranker else "a cost model"
    if not r.best_latency_s:
        return f"tune ({how}): {r.measured} candidates measured, {r.stopped}; database in {work_dir}"
    return (f"tune ({how}): {r.measured} candidates measured by MetaSchedule with {what} pre-trained on "
            f"{r.cost_data}, {r.seconds:.0f} s; best checked {r.best_latency_s * 1e6:.1f} us ({r.speedup:.2f}x the "
            f"baseline) -> {work_dir}/best.script, MetaSchedule database in {work_dir}")
