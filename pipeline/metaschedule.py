"""MetaSchedule as the yardstick: tune one kernel in this run, with the search stage's
settings, and return every measured candidate in measurement order with the wall time.

The evaluation re-times the candidates with the same verifier and timer as the model's
scripts (pipeline.verify), so the comparison never mixes two timers."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import codec, records
from pipeline.tvm_env import ms, worker_init


@dataclass
class Tuned:
    scripts: list[str | None]     # measured candidates in order; None where the trace did not encode
    ms_latency_s: list[float | None]  # MetaSchedule's own measurement (None = failed)
    seconds: float                # wall time of the whole tuning run
    trials: int


def tune(mod, target, trials: int, work_dir: Path, sp, name: str) -> Tuned:
    """sp: the search stage's SearchParams (population, timeouts, trials per iteration)."""
    work_dir = Path(work_dir)
    if work_dir.exists():
        for f in work_dir.glob("database_*.json"):
            f.unlink()   # a fresh run: the timing is part of the result
    work_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    ms.tune.tune_tasks(
        tasks=[ms.TuneContext(
            mod=mod, target=target, space_generator="post-order-apply",
            search_strategy=ms.search_strategy.EvolutionarySearch(
                population_size=sp.population_size, genetic_num_iters=sp.genetic_num_iters),
            task_name=name, rand_state=sp.seed, num_threads=sp.builder_workers,
            logger=ms.logging.get_logger(f"little_dragon.evaluate.{name}")).clone()],
        task_weights=[1.0], work_dir=str(work_dir), max_trials_global=trials, max_trials_per_task=trials,
        num_trials_per_iter=min(sp.trials_per_iter, trials),
        builder=ms.builder.LocalBuilder(max_workers=sp.builder_workers, timeout_sec=sp.build_timeout_s,
                                        initializer=worker_init),
        runner=ms.runner.LocalRunner(
            timeout_sec=sp.run_timeout_s, initializer=worker_init,
            evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=sp.min_repeat_ms)),
        database=ms.database.JSONDatabase(work_dir=str(work_dir)),
        task_scheduler="round-robin")
    seconds = time.perf_counter() - start
    scripts, lat = [], []
    for ref in records.scan(work_dir):
        try:
            scripts.append(codec.encode_json(mod, records.trace_at(ref), target))
        except (codec.DecodeError, TypeError, ValueError):
            scripts.append(None)
        lat.append(ref.latency_s)
    (work_dir / "summary.json").write_text(json.dumps({"seconds": seconds, "trials": len(scripts)}))
    return Tuned(scripts, lat, seconds, len(scripts))
