"""MetaSchedule as the yardstick: tune one kernel in this run, with the search stage's
settings, and return every measured candidate in measurement order with the wall time.

The evaluation re-times the candidates with the same verifier and timer as the model's
scripts (pipeline.verify), so the comparison never mixes two timers."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import codec, records, tuning


@dataclass
class Tuned:
    scripts: list[str | None]     # measured candidates in order; None where the trace did not encode
    ms_latency_s: list[float | None]  # MetaSchedule's own measurement (None = failed)
    seconds: float                # wall time of the whole tuning run
    trials: int


def settings(target, trials: int, sp) -> dict:
    """What a tuning run's result depends on (a finished run with the same ones is reused)."""
    return {"target": str(target), "trials": trials, "trials_per_iter": min(sp.trials_per_iter, trials),
            "population_size": sp.population_size, "genetic_num_iters": sp.genetic_num_iters,
            "first_round": sp.first_round}


def finished(work_dir: Path, target, trials: int, sp) -> dict | None:
    """The summary of the run in `work_dir` if it finished with these settings, else None."""
    path = Path(work_dir) / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    if summary.get("settings") != settings(target, trials, sp):
        return None
    return summary


def tune(mod, target, trials: int, work_dir: Path, sp, name: str, strategy=None, reuse: bool = False) -> Tuned:
    """sp: the search stage's SearchParams (population, timeouts, trials per iteration);
    `strategy`: another search strategy (e.g. pipeline.model_strategy.ModelFirst); `reuse`: a
    run that finished in `work_dir` with the same settings is read back, not repeated (an
    evaluation split into steps on a lent GPU; its wall time is the one recorded then)."""
    work_dir = Path(work_dir)
    done = finished(work_dir, target, trials, sp) if reuse and strategy is None else None
    if done is not None:
        return _read(mod, work_dir, done["seconds"])
    if work_dir.exists():
        for f in work_dir.glob("database_*.json"):
            f.unlink()   # a fresh run: the timing is part of the result
    work_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tuning.tune(sp, target, [(name, mod)], work_dir, trials, min(sp.trials_per_iter, trials), logger="evaluate",
                search_strategy=strategy)
    seconds = time.perf_counter() - start
    tuned = _read(mod, work_dir, seconds)
    summary = {"seconds": seconds, "trials": tuned.trials, "settings": settings(target, trials, sp)}
    (work_dir / "summary.json").write_text(json.dumps(summary))
    return tuned


def _read(mod, work_dir: Path, seconds: float) -> Tuned:
    scripts, lat = [], []
    for ref in records.scan(work_dir):
        try:
            scripts.append(codec.canonical_from_json(mod, records.trace_at(ref)))
        except (codec.DecodeError, TypeError, ValueError):
            scripts.append(None)
        lat.append(ref.latency_s)
    return Tuned(scripts, lat, seconds, len(scripts))
