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


def tune(mod, target, trials: int, work_dir: Path, sp, name: str, strategy=None) -> Tuned:
    """sp: the search stage's SearchParams (population, timeouts, trials per iteration);
    `strategy`: another search strategy (e.g. pipeline.model_strategy.ModelFirst)."""
    work_dir = Path(work_dir)
    if work_dir.exists():
        for f in work_dir.glob("database_*.json"):
            f.unlink()   # a fresh run: the timing is part of the result
    work_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tuning.tune(sp, target, [(name, mod)], work_dir, trials, min(sp.trials_per_iter, trials), logger="evaluate",
                search_strategy=strategy)
    seconds = time.perf_counter() - start
    scripts, lat = [], []
    for ref in records.scan(work_dir):
        try:
            scripts.append(codec.canonical_from_json(mod, records.trace_at(ref)))
        except (codec.DecodeError, TypeError, ValueError):
            scripts.append(None)
        lat.append(ref.latency_s)
    (work_dir / "summary.json").write_text(json.dumps({"seconds": seconds, "trials": len(scripts)}))
    return Tuned(scripts, lat, seconds, len(scripts))
