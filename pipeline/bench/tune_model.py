"""Benchmark: `little-dragon tune-model` against MetaSchedule's Relax tuning
(`ms.relax_integration.tune_relax`) at equal trials per task, end to end, in one run.

    python -m pipeline.bench.tune_model --model models/rl [--trials-per-task 16] \
        [--networks examples/networks/*.py] [--variants model ms_cost ms_rank ms_cost_tasks model_first_cost ...] \
        [--final-retime 10] [--out reports/bench_tune_model_cpu.json]

Per network: the model tunes every task (pipeline.tune_model); MetaSchedule tunes the same
tasks (its gradient task scheduler, evolutionary search, at most the same trials per task and
in total); both networks are compiled with their databases (`compile_relax`; untuned
functions built as TVM builds them) and run on the same random inputs, checked against the
untuned build's outputs, and timed with the same VM time evaluator. MetaSchedule builds with
the project's kept build pool (pipeline.tuning.PoolBuilder) so its wall time is not TVM's
per-round worker start-up; its runner is TVM's LocalRunner. Each network is timed right after
its own tuning, minutes apart from the others; with `--final-retime R` all of a network's
builds are also timed again R rounds side by side (`final`), their medians compared too.

Beside `model` (little-dragon tune-model), the one-argument ways into MetaSchedule's own Relax
tuning, same trials: `ms_cost` (`tune_relax(..., cost_model=...)` with the project's cost model
pre-trained on the target's campaign, `CostModel.as_metaschedule`) and `model_first_cost` (also
`strategy=ModelFirst(model)`: each task's first half of its trials written by the model), and
`transfer_first_cost` (`strategy=ModelFirst(proposer=transfer.Library...)`: each task's first
half carried over from the campaign's best scripts of other workloads, pipeline.transfer).
`ms_rank`: `tune_relax(..., cost_model=...)` with pipeline.rank_model's ranking model on the same
campaign data (`RankModel.as_metaschedule`), learning from the run as `ms_cost` does.
`ms_cost_tasks`: `tune-model --strategy ms-cost` (pipeline.tune_search: each task in turn, rounds of
8, the cost model counting the task's own measurements 16 times), what a user of the CLI gets.
"""

from __future__ import annotations

import argparse
import glob
import tempfile
import time
from pathlib import Path

from pipeline import files


VARIANTS = ("model", "ms_cost", "ms_rank", "ms_cost_tasks", "model_first_cost", "transfer_first_cost")


def _tune_relax(mod, target, trials: int, n_tasks: int, work: Path, **kw):
    """MetaSchedule's Relax tuning at `trials` a task (its gradient task scheduler), built by
    the project's kept pool; `kw`: tune_relax's own `strategy=` / `cost_model=`."""
    from pipeline import tune_model as tm
    from pipeline.tuning import Phases, PoolBuilder
    from pipeline.tvm_env import ms

    start = time.perf_counter()
    pool = PoolBuilder(2, 60.0, Phases())
    try:
        db = ms.relax_integration.tune_relax(tm.prepared(mod, target), None, target, str(work),
                                             max_trials_global=trials * n_tasks, max_trials_per_task=trials,
                                             num_trials_per_iter=min(16, trials), builder=pool, seed=0, **kw)
    finally:
        pool.shutdown()
    return db, time.perf_counter() - start


def final_retime(mod, target, databases: dict, rounds: int, seed: int = 0) -> dict:
    """Each contender's network (compiled with its database) timed again `rounds` times, the
    contenders taking turns round after round so slow drifts of the machine fall on all alike;
    a contender's figure is the median of its rounds. Each was timed once right after its own
    tuning, minutes apart from the others: these are side by side."""
    from statistics import median

    from pipeline import tune_model as tm

    inputs = tm.network_inputs(mod, seed)
    built = {key: tm.compile_network(mod, target, db) for key, db in databases.items()}
    samples = {key: [] for key in built}
    start = time.perf_counter()
    for _ in range(rounds):
        for key, executable in built.items():
            samples[key].append(tm.run_network(executable, mod, target, inputs)[1])
    return {"rounds": rounds, "seconds": round(time.perf_counter() - start, 1),
            "latency_s": {k: median(v) for k, v in samples.items()},
            "spread_s": {k: [min(v), max(v)] for k, v in samples.items()}}


def run_network(path: str, model_dir: str | None, target_spec, trials: int, work: Path,
                variants=("model",), cost=None, library=None, final_rounds: int = 0) -> dict:
    """One network: MetaSchedule's Relax tuning (the yardstick, always) and each of `variants`
    at the same trials; `cost()` makes a fresh pre-trained cost model, `library()` gives the
    transfer library. `final_rounds` > 0: every contender's network, the untuned one too,
    timed again that many rounds, side by side (`final_retime`, the row's `final`)."""
    from pipeline import tune_model as tm
    from pipeline.tvm_env import make_target

    target = make_target(target_spec)
    mod = tm.load_network(path)
    tasks = tm.extract_tasks(mod, target)
    untuned = tm.end_to_end(mod, target, tm.union([]))
    db, ms_s = _tune_relax(mod, target, trials, len(tasks), work / "ms")
    theirs = tm.end_to_end(mod, target, db, reference=untuned["outputs"])
    row = {"network": Path(path).stem, "tasks": len(tasks), "trials_per_task": trials,
           "untuned_s": untuned["latency_s"],
           "metaschedule": {"latency_s": theirs["latency_s"], "measured": len(db.get_all_tuning_records()),
                            "wall_s": round(ms_s, 1), "matches_untuned": theirs["matches_untuned"]}}
    databases = {"untuned": tm.union([]), "metaschedule": db}
    # `tune-model` itself: the language model (`model`), or what a user of `--strategy ms-cost` gets
    # (`ms_cost_tasks`: each task by pipeline.tune_search, focus 16, rounds of 8, one pre-trained cost
    # model shared by the tasks, loaded from its cache)
    for key, strategy in (("model", "model"), ("ms_cost_tasks", "ms-cost")):
        if key not in variants:
            continue
        start = time.perf_counter()
        ours = tm.tune_model(path, target_spec, trials, model_dir if strategy == "model" else None, str(work / key),
                             progress=False, strategy=strategy)
        row[key] = {"latency_s": ours["tuned_latency_s"], "measured": ours["measured"],
                    "wall_s": round(time.perf_counter() - start, 1), "matches_untuned": ours["matches_untuned"]}
        databases[key] = tm.union(sorted(d for d in (work / key / "tasks").glob("*")
                                         if (d / "database_tuning_record.json").exists()))
    from pipeline.rank_model import for_search

    for key in ("ms_cost", "ms_rank", "model_first_cost", "transfer_first_cost"):
        if key not in variants:
            continue
        kw = {"cost_model": for_search(cost(train=False), ranker=key == "ms_rank")}     # either trains its own
        if key in ("model_first_cost", "transfer_first_cost"):
            from pipeline.model_strategy import ModelFirst

            kw["strategy"] = (ModelFirst(model_dir, batch=max(1, trials // 2)) if key == "model_first_cost"
                              else ModelFirst(proposer=library(), batch=max(1, trials // 2)))
        vdb, v_s = _tune_relax(mod, target, trials, len(tasks), work / key, **kw)
        got = tm.end_to_end(mod, target, vdb, reference=untuned["outputs"])
        row[key] = {"latency_s": got["latency_s"], "measured": len(vdb.get_all_tuning_records()),
                    "wall_s": round(v_s, 1), "matches_untuned": got["matches_untuned"]}
        databases[key] = vdb
    for key in VARIANTS:
        if key in row:
            row[f"{key}_over_ms"] = row[key]["latency_s"] / theirs["latency_s"]
    if final_rounds > 0:
        row["final"] = final_retime(mod, target, databases, final_rounds)
        lat = row["final"]["latency_s"]
        for key in VARIANTS:
            if key in lat:
                row[f"final_{key}_over_ms"] = lat[key] / lat["metaschedule"]
    return row


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["network"] for r in rows]
    x = range(len(rows))
    bars = [("untuned", "untuned"), ("metaschedule", "MetaSchedule")] + [
        (k, LABELS[k]) for k in VARIANTS if all(k in r for r in rows)]
    w = 0.8 / len(bars)
    for k, (key, label) in enumerate(bars):
        vals = [(r["untuned_s"] if key == "untuned" else r[key]["latency_s"]) * 1e6 for r in rows]
        ax.bar([i + (k - (len(bars) - 1) / 2) * w for i in x], vals, width=w, label=label)
    ax.set_xticks(list(x), names)
    ax.set_yscale("log")
    ax.set_ylabel("end-to-end latency (us, log)")
    ax.set_title(f"Relax networks, {rows[0]['trials_per_task']} trials per task (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


LABELS = {"model": "model (tune-model)", "ms_cost": "MetaSchedule + pre-trained cost model",
          "ms_rank": "MetaSchedule + pre-trained ranking model",
          "ms_cost_tasks": "tune-model --strategy ms-cost (per task, focus 16)",
          "model_first_cost": "ModelFirst + pre-trained cost model",
          "transfer_first_cost": "campaign scripts carried over first + pre-trained cost model"}


def summarize(rows: list[dict], target_spec, args, host: dict) -> dict:
    """The benchmark file: the networks done so far, and per variant on how many its end-to-end
    latency is <= MetaSchedule's (and the same for the builds timed again side by side)."""
    out = {"machine": host, "target": target_spec, "model": args.model, "variants": args.variants,
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),     # the latest network's end: tune_history's order
           "networks": rows}
    for key in args.variants:
        out[f"{key}_at_or_below_ms"] = f"{sum(r[f'{key}_over_ms'] <= 1.0 for r in rows)}/{len(rows)}"
        if args.final_retime:
            out[f"final_{key}_at_or_below_ms"] = f"{sum(r[f'final_{key}_over_ms'] <= 1.0 for r in rows)}/{len(rows)}"
    return out


def main(argv: list[str] | None = None) -> dict:
    from pipeline.bench.search import machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a model folder (needed by model, model_first_cost)")
    ap.add_argument("--variants", nargs="+", default=["model"], choices=VARIANTS,
                    help="what runs beside MetaSchedule's tune_relax (default: model)")
    ap.add_argument("--networks", nargs="*", default=sorted(glob.glob("examples/networks/*.py")))
    ap.add_argument("--trials-per-task", type=int, default=16)
    ap.add_argument("--target", default='{"kind": "llvm", "num-cores": 2}')
    ap.add_argument("--final-retime", type=int, default=0, metavar="ROUNDS",
                    help="time every contender's network again ROUNDS times, taking turns, and compare their "
                         "medians too (default 0: not)")
    ap.add_argument("--out", default="reports/bench_tune_model_cpu.json")
    args = ap.parse_args(argv)
    if args.final_retime < 0:
        ap.error(f"--final-retime must be >= 0 (got {args.final_retime})")
    if set(args.variants) & {"model", "model_first_cost"} and not args.model:
        ap.error("--model is needed by the variants model and model_first_cost")
    import json

    target_spec = json.loads(args.target) if args.target.startswith("{") else args.target
    pretrained = []

    def cost(train: bool = True):   # pre-trained once (the target's campaign kept in git), a fresh copy each use
        if not pretrained:
            from pipeline import cost_model

            pretrained.append(cost_model.for_target(target_spec)[0])
        return pretrained[0].copy(train)

    libraries = []

    def library():    # the transfer library, loaded once
        if not libraries:
            from pipeline import transfer

            libraries.append(transfer.Library.for_target(target_spec))
        return libraries[0]

    rows, host = [], machine()
    out = summarize(rows, target_spec, args, host)
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.networks:
            row = run_network(path, args.model, target_spec, args.trials_per_task, Path(tmp) / Path(path).stem,
                              args.variants, cost, library, args.final_retime)
            print(json.dumps(row), flush=True)
            rows.append(row)
            out = summarize(rows, target_spec, args, host)
            files.write_json(args.out, out)    # kept after every network: an interrupted run keeps those done
    _plot(rows, Path(args.out).with_suffix(".png"))
    print("<= MetaSchedule end to end: " + ", ".join(f"{k} {out[f'{k}_at_or_below_ms']}" for k in args.variants)
          + f" -> {args.out}")
    if args.final_retime:
        print(f"timed again {args.final_retime} times side by side: "
              + ", ".join(f"{k} {out[f'final_{k}_at_or_below_ms']}" for k in args.variants))
    return out


if __name__ == "__main__":
    main()
