"""Benchmark: model-guided tuning (`little-dragon tune`) against MetaSchedule's evolutionary
search at equal measured candidates, on TVM's te_workload kernels, in one run.

    python -m pipeline.bench.tune --model models/rl [--tasks GMM:0 SFM:0 ...] [--trials 16] \
        [--ms-trials 64] [--oversample 4] [--cost-data DIR|none] [--checker-workers 2] \
        [--out reports/bench_tune_cpu.json]

Per task: the model tunes `--trials` candidates (construction, then refinement rounds);
MetaSchedule tunes `--ms-trials` (population 512 x 4, 16 per round); and the model inside
MetaSchedule (pipeline.model_strategy.ModelFirst) tunes `--trials`: half written by the model,
the rest evolved by MetaSchedule from them; with `--oversample K` (default 4), the model with a
cost model (pipeline.cost_model, pre-trained on the target's search campaign unless `--cost-data`
says otherwise) choosing what to measure among K times each batch. Every candidate of each is
timed by the same checker (pipeline.verify), so the comparison never mixes two timers:
MetaSchedule's best of its first K is the fastest of its first K candidates as the checker
times them, as in the evaluation. Reported: best latency after 8, 16, ... candidates for
both, the candidates the model needed to reach MetaSchedule's 64-candidate result, the wall
time of each, and a plot of latency against candidates (reports/bench_tune_cpu.png).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

TASKS = ["GMM:0", "SFM:0", "NRM:0", "C1D:0", "C2D:0", "DEP:0", "T2D:0", "GRP:0"]


def _best_curve(latencies: list[float | None]) -> list[float | None]:
    out, best = [], None
    for x in latencies:
        if x is not None and (best is None or x < best):
            best = x
        out.append(best)
    return out


def run_task(item: str, model, tok, target_spec, trials: int, ms_trials: int, sp, checker,
             oversample: int = 1, cost=None) -> dict:
    """`oversample` > 1: also the model with a cost model choosing what to measure among
    `oversample` times the batch (`cost()` makes a fresh one: pre-trained or empty)."""
    from pipeline import metaschedule
    from pipeline.model_strategy import ModelFirst
    from pipeline.stages.evaluate import te_module
    from pipeline.tune import Tuner
    from pipeline.tvm_env import make_target

    target = make_target(target_spec)
    mod = te_module(item)
    row = {"task": item}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        r = Tuner(mod, target_spec, model, tok, Path(tmp) / "model", checker=checker).run(trials, progress=False)
        row["model"] = {"seconds": round(time.perf_counter() - start, 1), "generation_seconds": round(r.generation_seconds, 1),
                        "curve": r.curve, "measured": r.measured,
                        "correct": r.correct, "rounds": r.rounds, "baseline_s": r.baseline_s, "stopped": r.stopped,
                        "sampled": r.sampled}
        if oversample > 1:
            start = time.perf_counter()
            cm = cost()
            load_s = time.perf_counter() - start     # pre-training (first task) or its copy, not the tune
            start = time.perf_counter()
            pretrained_on = cm.size
            r = Tuner(mod, target_spec, model, tok, Path(tmp) / "model_cost", checker=checker, cost_model=cm,
                      oversample=oversample).run(trials, progress=False)
            row["model_cost"] = {"seconds": round(time.perf_counter() - start, 1),
                                 "generation_seconds": round(r.generation_seconds, 1), "curve": r.curve,
                                 "measured": r.measured, "written": r.written, "correct": r.correct,
                                 "rounds": r.rounds, "stopped": r.stopped, "sampled": r.sampled,
                                 "pretrained_on": pretrained_on, "cost_model_load_seconds": round(load_s, 1),
                                 "trained_on_after_tune": cm.trained_on}
        tuned = metaschedule.tune(mod, target, ms_trials, Path(tmp) / "ms", sp, f"bench_{item}")
        row["metaschedule"] = _retimed(tuned, mod, target_spec, checker)
        # the model inside MetaSchedule: its first batch written by the model, the rest evolved
        hybrid = ModelFirst((model, tok), batch=max(1, trials // 2), population_size=sp.population_size,
                            genetic_num_iters=sp.genetic_num_iters)
        tuned = metaschedule.tune(mod, target, trials, Path(tmp) / "hybrid", sp, f"bench_{item}_hybrid", strategy=hybrid)
        row["model_first"] = {**_retimed(tuned, mod, target_spec, checker), "from_model": len(hybrid.proposed)}
    return row


def _retimed(tuned, mod, target_spec, checker) -> dict:
    """MetaSchedule's candidates, in its order, re-timed by the checker that timed the model's."""
    start = time.perf_counter()
    scripts = [s for s in tuned.scripts if s is not None]
    timed = dict(zip(scripts, checker.check_many(mod, scripts, target_spec, timed=True)))
    lat = [timed[s].latency_s if s is not None and timed[s].correct else None for s in tuned.scripts]
    return {"seconds": round(tuned.seconds, 1), "retime_seconds": round(time.perf_counter() - start, 1),
            "curve": _best_curve(lat), "measured": len(lat), "correct": sum(x is not None for x in lat)}


def summarize(rows: list[dict], trials: int, ms_trials: int) -> dict:
    def at(curve, k):
        return curve[min(k, len(curve)) - 1] if curve else None

    per, wins, reach, hybrid_wins, cost_wins = [], 0, [], 0, 0
    for row in rows:
        m, s = row["model"]["curve"], row["metaschedule"]["curve"]
        ms_full = at(s, ms_trials)
        model_n = at(m, trials)
        win = model_n is not None and ms_full is not None and model_n <= ms_full
        wins += win
        hybrid_n = at(row["model_first"]["curve"], trials) if "model_first" in row else None
        hybrid_wins += hybrid_n is not None and ms_full is not None and hybrid_n <= ms_full
        cost_n = at(row["model_cost"]["curve"], trials) if "model_cost" in row else None
        cost_wins += cost_n is not None and ms_full is not None and cost_n <= ms_full
        need = next((i + 1 for i, x in enumerate(m) if x is not None and ms_full is not None and x <= ms_full), None)
        reach.append(need)
        per.append({"task": row["task"], f"model@{trials}": model_n, f"ms@{trials}": at(s, trials),
                    f"ms@{ms_trials}": ms_full, "model_le_ms_full": win, "model_trials_to_ms_full": need,
                    f"model_first@{trials}": hybrid_n, f"model_cost@{trials}": cost_n,
                    "ratio_model_cost_to_ms_full": (cost_n / ms_full) if cost_n and ms_full else None,
                    "model_seconds": row["model"]["seconds"], "ms_seconds": row["metaschedule"]["seconds"],
                    "ratio_model_to_ms_full": (model_n / ms_full) if model_n and ms_full else None})
    return {"tasks": len(rows), "trials": trials, "ms_trials": ms_trials,
            f"model@{trials}_le_ms@{ms_trials}": wins, "fraction": wins / len(rows) if rows else None,
            f"model_first@{trials}_le_ms@{ms_trials}": hybrid_wins,
            f"model_cost@{trials}_le_ms@{ms_trials}": cost_wins,
            "target_fraction": 0.7, "per_task": per}


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    cols = min(4, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4 * cols, 3 * ((n + cols - 1) // cols)), squeeze=False)
    for ax, row in zip(axes.flat, rows):
        for key, label in (("model", "model (tune)"), ("model_cost", "model + cost model (tune)"),
                           ("metaschedule", "MetaSchedule"), ("model_first", "model first, then MetaSchedule")):
            if key not in row:
                continue
            curve = row[key]["curve"]
            xs = [i + 1 for i, y in enumerate(curve) if y is not None]
            ax.plot(xs, [curve[i - 1] * 1e6 for i in xs], label=label)
        ax.set_title(row["task"])
        ax.set_xlabel("measured candidates")
        ax.set_ylabel("best latency (us)")
        ax.set_xscale("log", base=2)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/rl")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--ms-trials", type=int, default=64)
    ap.add_argument("--out", default="reports/bench_tune_cpu.json")
    ap.add_argument("--oversample", type=int, default=4,
                    help="also tune with a cost model choosing among this many times the batch (1: not)")
    ap.add_argument("--checker-workers", type=int, default=2,
                    help="processes building the checked scripts (the machine's cores less two; 14 on one H200)")
    ap.add_argument("--cost-data", default=None,
                    help="a search work folder to pre-train the cost model on (default: the target's campaign in "
                         "databases/; none: it learns from each tune's measurements only)")
    args = ap.parse_args()
    import yaml

    from pipeline import files, models, params as P
    from pipeline.stages.search import SearchParams
    from pipeline.verify import Checker

    raw = yaml.safe_load(Path(args.params).read_text())
    # MetaSchedule at its own defaults (population 512 x 4 generations), 16 candidates a round so
    # its cost model learns over the 64: the strongest MetaSchedule this budget allows
    sp = dataclasses.replace(P.from_dict(SearchParams, raw["search"], "search"), population_size=512,
                             genetic_num_iters=4, trials_per_iter=16)
    model, tok = models.load(args.model)
    checker = Checker(timeout_s=120, workers=args.checker_workers)
    from pipeline import cost_model

    pretrained = []       # pre-trained once; each task's tune gets its own copy

    def cost():
        if args.cost_data == "none":
            return cost_model.CostModel(raw["search"]["target"])
        if not pretrained:
            pretrained.append(cost_model.for_target(raw["search"]["target"], args.cost_data)[0])
        return pretrained[0].copy()

    rows = []
    for item in args.tasks:
        rows.append(run_task(item, model, tok, raw["search"]["target"], args.trials, args.ms_trials, sp, checker,
                             args.oversample, cost))
        summary = summarize(rows, args.trials, args.ms_trials)
        files.write_json(args.out, {"model": args.model, "target": raw["search"]["target"], **summary, "rows": rows})
        print(summary["per_task"][-1], flush=True)
    plot(rows, str(Path(args.out).with_suffix(".png")))
    s = summarize(rows, args.trials, args.ms_trials)
    print(f"model@{args.trials} <= MetaSchedule@{args.ms_trials} on {s[f'model@{args.trials}_le_ms@{args.ms_trials}']}"
          f"/{s['tasks']} tasks; ModelFirst@{args.trials}: {s[f'model_first@{args.trials}_le_ms@{args.ms_trials}']}"
          f"/{s['tasks']}; model + cost model: {s[f'model_cost@{args.trials}_le_ms@{args.ms_trials}']}"
          f"/{s['tasks']} -> {args.out}")


if __name__ == "__main__":
    main()
