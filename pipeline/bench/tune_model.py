"""Benchmark: `little-dragon tune-model` against MetaSchedule's Relax tuning
(`ms.relax_integration.tune_relax`) at equal trials per task, end to end, in one run.

    python -m pipeline.bench.tune_model --model models/rl [--trials-per-task 16] \
        [--networks examples/networks/*.py] [--out reports/bench_tune_model_cpu.json]

Per network: the model tunes every task (pipeline.tune_model); MetaSchedule tunes the same
tasks (its gradient task scheduler, evolutionary search, at most the same trials per task and
in total); both networks are compiled with their databases (`compile_relax`; untuned
functions built as TVM builds them) and run on the same random inputs, checked against the
untuned build's outputs, and timed with the same VM time evaluator. MetaSchedule builds with
the project's kept build pool (pipeline.tuning.PoolBuilder) so its wall time is not TVM's
per-round worker start-up; its runner is TVM's LocalRunner.
"""

from __future__ import annotations

import argparse
import glob
import tempfile
import time
from pathlib import Path

from pipeline import files


def run_network(path: str, model_dir: str, target_spec, trials: int, work: Path) -> dict:
    from pipeline import tune_model as tm
    from pipeline.tuning import Phases, PoolBuilder
    from pipeline.tvm_env import make_target, ms

    target = make_target(target_spec)
    start = time.perf_counter()
    ours = tm.tune_model(path, target_spec, trials, model_dir, str(work / "model"), progress=False)
    ours_s = time.perf_counter() - start
    mod = tm.load_network(path)
    tasks = tm.extract_tasks(mod, target)
    start = time.perf_counter()
    pool = PoolBuilder(2, 60.0, Phases())
    db = ms.relax_integration.tune_relax(tm.prepared(mod, target), None, target, str(work / "ms"),
                                         max_trials_global=trials * len(tasks), max_trials_per_task=trials,
                                         num_trials_per_iter=min(16, trials), builder=pool, seed=0)
    pool.shutdown()
    ms_s = time.perf_counter() - start
    untuned = tm.end_to_end(mod, target, tm.union([]))
    theirs = tm.end_to_end(mod, target, db, reference=untuned["outputs"])
    ms_trials = len(db.get_all_tuning_records())
    return {"network": Path(path).stem, "tasks": len(tasks), "trials_per_task": trials,
            "untuned_s": untuned["latency_s"],
            "model": {"latency_s": ours["tuned_latency_s"], "measured": ours["measured"], "wall_s": round(ours_s, 1),
                      "matches_untuned": ours["matches_untuned"]},
            "metaschedule": {"latency_s": theirs["latency_s"], "measured": ms_trials, "wall_s": round(ms_s, 1),
                             "matches_untuned": theirs["matches_untuned"]},
            "model_over_ms": ours["tuned_latency_s"] / theirs["latency_s"]}


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["network"] for r in rows]
    x = range(len(rows))
    for k, (key, label) in enumerate([("untuned", "untuned"), ("metaschedule", "MetaSchedule"), ("model", "model")]):
        vals = [(r["untuned_s"] if key == "untuned" else r[key]["latency_s"]) * 1e6 for r in rows]
        ax.bar([i + (k - 1) * 0.27 for i in x], vals, width=0.27, label=label)
    ax.set_xticks(list(x), names)
    ax.set_yscale("log")
    ax.set_ylabel("end-to-end latency (us, log)")
    ax.set_title(f"Relax networks, {rows[0]['trials_per_task']} trials per task (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    from pipeline.bench.search import machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--networks", nargs="*", default=sorted(glob.glob("examples/networks/*.py")))
    ap.add_argument("--trials-per-task", type=int, default=16)
    ap.add_argument("--target", default='{"kind": "llvm", "num-cores": 2}')
    ap.add_argument("--out", default="reports/bench_tune_model_cpu.json")
    args = ap.parse_args(argv)
    import json

    target_spec = json.loads(args.target) if args.target.startswith("{") else args.target
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.networks:
            row = run_network(path, args.model, target_spec, args.trials_per_task, Path(tmp) / Path(path).stem)
            print(json.dumps(row), flush=True)
            rows.append(row)
    wins = sum(r["model_over_ms"] <= 1.0 for r in rows)
    out = {"machine": machine(), "target": target_spec, "model": args.model, "networks": rows,
           "model_at_or_below_ms": f"{wins}/{len(rows)}"}
    files.write_json(args.out, out)
    _plot(rows, Path(args.out).with_suffix(".png"))
    print(f"model <= MetaSchedule end to end on {wins}/{len(rows)} networks -> {args.out}")
    return out


if __name__ == "__main__":
    main()
