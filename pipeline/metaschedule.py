"""MetaSchedule as the yardstick: tune one kernel (or a group of kernels in one run) in this
run, with the search stage's settings, and return every measured candidate in measurement
order with the wall time.

The evaluation re-times the candidates with the same verifier and timer as the model's
scripts (pipeline.verify), so the comparison never mixes two timers."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import codec, files, records, tuning


@dataclass
class Tuned:
    scripts: list[str | None]     # measured candidates in order; None where the trace did not encode
    ms_latency_s: list[float | None]  # MetaSchedule's own measurement (None = failed)
    seconds: float                # wall time of the whole tuning run
    trials: int
    run: str = ""                 # digest of the run's database: which run these candidates are


# MetaSchedule's EvolutionarySearch defaults for the settings the search params added later
STRATEGY_DEFAULTS = {"init_min_unmeasured": 50, "max_fail_count": 5}


def settings(target, trials: int, sp, group: int = 1) -> dict:
    """What a tuning run's result depends on (a finished run with the same ones is reused).
    `group`: up to how many kernels one MetaSchedule run tunes together (see `tune_group`)."""
    out = {"target": str(target), "trials": trials, "trials_per_iter": min(sp.trials_per_iter, trials),
           "population_size": sp.population_size, "genetic_num_iters": sp.genetic_num_iters,
           "first_round": sp.first_round}
    # named only when not MetaSchedule's default: runs kept before the setting existed stay valid
    out.update({k: getattr(sp, k) for k, default in STRATEGY_DEFAULTS.items() if getattr(sp, k, default) != default})
    return {**out, "tasks_per_run": group} if group > 1 else out


def finished(work_dir: Path, target, trials: int, sp, group: int = 1) -> dict | None:
    """The summary of the run in `work_dir` if it finished with these settings, else None."""
    path = Path(work_dir) / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    if summary.get("settings") != settings(target, trials, sp, group):
        return None
    return summary


def tune(mod, target, trials: int, work_dir: Path, sp, name: str, strategy=None, reuse: bool = False,
         cost_model=None) -> Tuned:
    """sp: the search stage's SearchParams (population, timeouts, trials per iteration);
    `strategy`: another search strategy (e.g. pipeline.model_strategy.ModelFirst); `cost_model`:
    MetaSchedule's cost model object (default: its own, untrained); `reuse`: a
    run that finished in `work_dir` with the same settings is read back, not repeated (an
    evaluation split into steps on a lent GPU; its wall time is the one recorded then)."""
    work_dir = Path(work_dir)
    done = finished(work_dir, target, trials, sp) if reuse and strategy is None and cost_model is None else None
    if done is not None:
        return _read(mod, work_dir, done["seconds"])
    if work_dir.exists():
        for f in work_dir.glob("database_*.json"):
            f.unlink()   # a fresh run: the timing is part of the result
    work_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tuning.tune(sp, target, [(name, mod)], work_dir, trials, min(sp.trials_per_iter, trials), logger="evaluate",
                search_strategy=strategy, cost_model=cost_model)
    seconds = time.perf_counter() - start
    tuned = _read(mod, work_dir, seconds)
    summary = {"seconds": seconds, "trials": tuned.trials, "settings": settings(target, trials, sp)}
    (work_dir / "summary.json").write_text(json.dumps(summary))
    return tuned


def tune_group(items: list[tuple[str, object, Path]], target, trials: int, sp, group: int,
               reuse: bool = False) -> list[Tuned]:
    """Tune up to `group` kernels (name, module, work folder) in one MetaSchedule run: round-robin
    over the tasks with one cost model, as MetaSchedule's Relax integration tunes a network's
    tasks, so one task's candidates are measured while the next one searches and builds (with
    `group` 1, one kernel alone under `tune`'s settings, so either reads the other's runs). Each
    kernel then gets its own database in its work folder, in measurement order, and a
    `summary.json` whose `seconds` is the run's wall time shared equally among its kernels (the
    whole run's in `group_run`). With `reuse`, kernels whose run finished with these settings are
    read back and only the others are tuned."""
    import tempfile

    from pipeline.tvm_env import structural_hash

    out: dict[str, Tuned] = {}
    todo = []
    for name, mod, work_dir in items:
        done = finished(work_dir, target, trials, sp, group) if reuse else None
        if done is not None:
            out[name] = _read(mod, Path(work_dir), done["seconds"])
        else:
            todo.append((name, mod, Path(work_dir)))
    hashes = [structural_hash(mod) for _, mod, _ in todo]
    if len(set(hashes)) < len(hashes):
        raise ValueError(f"tune_group: two of {[n for n, _, _ in todo]} are the same kernel; tune it once")
    if todo:
        parent = todo[0][2].parent
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=parent, prefix=".group-") as tmp:
            start = time.perf_counter()
            tuning.tune(sp, target, [(name, mod) for name, mod, _ in todo], Path(tmp), trials,
                        min(sp.trials_per_iter, trials), logger="evaluate")
            seconds = time.perf_counter() - start
            for name, mod, work_dir in todo:
                _split(Path(tmp), mod, work_dir)
                out[name] = _read(mod, work_dir, seconds / len(todo))
                summary = {"seconds": seconds / len(todo), "trials": out[name].trials,
                           "settings": settings(target, trials, sp, group),
                           "group_run": {"tasks": [n for n, _, _ in todo], "seconds": seconds}}
                (work_dir / "summary.json").write_text(json.dumps(summary))
    return [out[name] for name, _, _ in items]


def _split(src: Path, mod, dst: Path) -> None:
    """`mod`'s workload and tuning records from the database in `src` into a database of its own
    in `dst` (records in measurement order)."""
    from pipeline.tvm_env import structural_hash

    key = structural_hash(mod)
    index = records.workload_hashes(src).index(key)
    workload = (src / "database_workload.json").read_text().splitlines()[index]
    lines = []
    with open(src / "database_tuning_record.json") as f:
        for raw in f:
            head, _, rest = raw.partition(",")     # '[<workload index>,<record>]': the record kept as written
            i = head.lstrip("[ ")
            if rest.endswith("\n") and i.isdigit() and int(i) == index:
                lines.append("[0," + rest)     # a torn last line (no newline) is left out
    if dst.exists():
        for old in dst.glob("database_*.json"):
            old.unlink()
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "database_workload.json").write_text(workload + "\n")
    (dst / "database_tuning_record.json").write_text("".join(lines))


def run_digest(work_dir: Path) -> str:
    """Names one tuning run: a digest of its database's records (the same for its archived copy)."""
    path = Path(work_dir) / "database_tuning_record.json"
    return hashlib.sha256(path.read_bytes() if path.exists() else b"").hexdigest()[:16]


SCRIPTS = "scripts.json"    # a run's candidates as scripts, kept beside its database (and archived with it)


def _read(mod, work_dir: Path, seconds: float) -> Tuned:
    """The run's candidates in measurement order. Encoding them is most of a step's start-up
    when an evaluation reads dozens of kept runs back (44 runs, 2,777 traces: 40 s on 2 cores),
    so the scripts are kept in `scripts.json` for this run's records and this codec."""
    refs = list(records.scan(work_dir))
    run = run_digest(work_dir)
    key = {"run": run, "codec": files.source_digest(codec.__file__)}
    path = Path(work_dir) / SCRIPTS
    scripts = files.read_keyed(path, key)
    if scripts is None or len(scripts) != len(refs):
        scripts = []
        for ref in refs:
            try:
                scripts.append(codec.canonical_from_json(mod, records.trace_at(ref)))
            except (codec.DecodeError, TypeError, ValueError):
                scripts.append(None)
        files.write_keyed(path, key, scripts)
    return Tuned(scripts, [ref.latency_s for ref in refs], seconds, len(scripts), run)
