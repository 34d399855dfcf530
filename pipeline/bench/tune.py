"""Benchmark: model-guided tuning (`little-dragon tune`) against MetaSchedule's evolutionary
search at equal measured candidates, on TVM's te_workload kernels, in one run.

    python -m pipeline.bench.tune --model models/rl [--tasks GMM:0 SFM:0 ...] [--trials 16] \
        [--ms-trials 64] [--oversample 4] [--cost-data DIR|none] [--checker-workers 2] \
        [--variants model model_cost model_first model_first_cost ms_cost] [--inside-per-iter 4] [--focus 16] \
        [--inside-search 2048x8] [--transfer-rank cost|nearest] [--final-retime 10] \
        [--out reports/bench_tune_cpu.json]

Per task: the model tunes `--trials` candidates (construction, then refinement rounds);
MetaSchedule tunes `--ms-trials` (population 512 x 4, 16 per round); and the model inside
MetaSchedule (pipeline.model_strategy.ModelFirst) tunes `--trials`: half written by the model,
the rest evolved by MetaSchedule from them, ranked by its own cost model (which starts empty:
`model_first`) or by the pre-trained one (`model_first_cost`, through
`CostModel.as_metaschedule`); MetaSchedule's search alone with the pre-trained cost model
(`ms_cost`, the ablation: what the cost model brings without the language model; `--inside-per-iter`
in rounds that retrain it on the kernel's measurements, `--focus N` counting those N times); the
same search ranked by the ranking model pre-trained on the same data (`ms_rank`, pipeline.rank_model); with
`--oversample K` (default 4), the model with a
cost model (pipeline.cost_model, pre-trained on the target's search campaign unless `--cost-data`
says otherwise) choosing what to measure among K times each batch. Every candidate of each is
timed by the same checker (pipeline.verify), so the comparison never mixes two timers:
MetaSchedule's best of its first K is the fastest of its first K candidates as the checker
times them, as in the evaluation. Reported: best latency after 8, 16, ... candidates for
both, the candidates the model needed to reach MetaSchedule's 64-candidate result, the wall
time of each, and a plot of latency against candidates (reports/bench_tune_cpu.png).

A best of single timings favours the contender that timed more candidates (the fastest of 64
noisy timings is luckier than the fastest of 16). With `--final-retime R`, each contender's
finalist, the script it would hand its user, is timed again R times, the contenders taking
turns, and their medians are compared too (`final` in each row, `final_*` in the summary).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from pipeline.stats import geomean

TASKS = ["GMM:0", "SFM:0", "NRM:0", "C1D:0", "C2D:0", "DEP:0", "T2D:0", "GRP:0"]


def _best_curve(latencies: list[float | None]) -> list[float | None]:
    out, best = [], None
    for x in latencies:
        if x is not None and (best is None or x < best):
            best = x
        out.append(best)
    return out


VARIANTS = ("model", "model_cost", "model_first", "model_first_cost", "ms_cost", "ms_cost_eps", "ms_rank",
            "transfer_first_cost")


def run_task(item: str, model, tok, target_spec, trials: int, ms_trials: int, sp, checker,
             oversample: int = 1, cost=None, variants=VARIANTS, inside_per_iter: int | None = None,
             focus: int = 1, inside_search: tuple[int, int] | None = None, library=None,
             transfer_rank: str = "cost", final_rounds: int = 0, eps_greedy: float = 0.25) -> dict:
    """One task: MetaSchedule@ms_trials (the yardstick, always) and each of `variants` at
    `trials`. `cost()` makes a fresh cost model (pre-trained or empty) for the variants that
    use one; `model_cost` runs only with `oversample` > 1 (the model writes that many times
    each batch and the cost model chooses what to measure). `inside_per_iter`: candidates a
    round for the variants inside MetaSchedule (default: the yardstick's own, `sp`'s); `focus`:
    how many times their cost model counts the kernel's own measurements (`as_metaschedule`);
    `inside_search`: their evolutionary search's (population, generations), default the yardstick's.
    `library()`: the transfer library (pipeline.transfer) of `transfer_first_cost`, whose first
    batch `transfer_rank` picks (pipeline.transfer.first). `eps_greedy`: the share of each round
    `ms_cost_eps` measures at random rather than by the cost model. `final_rounds` > 0: the finalists
    (MetaSchedule's best of its first `trials` and `ms_trials`, each variant's of its `trials`)
    timed again that many rounds each, side by side (`final_retime`, the row's `final`)."""
    from pipeline import metaschedule
    from pipeline.stages.evaluate import te_module
    from pipeline.tvm_env import make_target

    target = make_target(target_spec)
    mod = te_module(item)
    row = {"task": item}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "model" in variants:
            row["model"] = _tune(mod, target_spec, model, tok, tmp / "model", checker, trials)
        if "model_cost" in variants and oversample > 1:
            row["model_cost"] = _tune(mod, target_spec, model, tok, tmp / "model_cost", checker, trials, cost, oversample)
        tuned = metaschedule.tune(mod, target, ms_trials, tmp / "ms", sp, f"bench_{item}")
        row["metaschedule"] = _retimed(tuned, mod, target_spec, checker)
        if inside_per_iter:
            sp = dataclasses.replace(sp, trials_per_iter=inside_per_iter)
        if inside_search:
            sp = dataclasses.replace(sp, population_size=inside_search[0], genetic_num_iters=inside_search[1])
        # the model inside MetaSchedule: its first batch written by the model, the rest evolved by
        # MetaSchedule's own cost model (which starts empty) or, with `_cost`, the pre-trained one
        for key, pre in (("model_first", None), ("model_first_cost", cost)):
            if key in variants:
                row[key] = _inside(mod, target, target_spec, trials, sp, checker, tmp / key, f"bench_{item}_{key}",
                                   (model, tok), pre, focus)
        if "ms_cost" in variants:
            # ablation: MetaSchedule's evolutionary search alone with the pre-trained cost model (no
            # language model): what the cost model brings without the model's scripts
            row["ms_cost"] = _inside(mod, target, target_spec, trials, sp, checker, tmp / "ms_cost",
                                     f"bench_{item}_ms_cost", None, cost, focus)
        if "ms_cost_eps" in variants:
            # the same, hedged: `eps_greedy` of each round picked at random from the population rather
            # than by the pre-trained cost model (MetaSchedule's 0.05 of a round of 8 picks none), so
            # a kernel the campaign's model misranks still gets MetaSchedule's own exploration
            row["ms_cost_eps"] = _inside(mod, target, target_spec, trials, sp, checker, tmp / "ms_cost_eps",
                                         f"bench_{item}_ms_cost_eps", None, cost, focus, eps_greedy=eps_greedy)
        if "ms_rank" in variants:
            # the same search ranked by the ranking model pre-trained on the same campaign data
            # (pipeline.rank_model: per-workload pairwise ranking rather than the pack-sum regression)
            row["ms_rank"] = _inside(mod, target, target_spec, trials, sp, checker, tmp / "ms_rank",
                                     f"bench_{item}_ms_rank", None, cost, focus, ranker=True)
        if "transfer_first_cost" in variants:
            # no language model either: the campaign's best scripts of other workloads carried onto
            # this kernel (ranked by the pre-trained cost model) as the first batch, then ms_cost
            row["transfer_first_cost"] = _inside(mod, target, target_spec, trials, sp, checker,
                                                 tmp / "transfer_first_cost", f"bench_{item}_transfer", None, cost,
                                                 focus, library(), transfer_rank)
        candidates = {key: row[key].pop("_candidates") for key in row if isinstance(row[key], dict)
                      and "_candidates" in row[key]}
        if final_rounds > 0:
            finalists = {f"metaschedule@{ms_trials}": best_of_first(candidates["metaschedule"], ms_trials),
                         f"metaschedule@{trials}": best_of_first(candidates["metaschedule"], trials)}
            finalists.update({key: best_of_first(c, trials) for key, c in candidates.items() if key != "metaschedule"})
            row["final"] = final_retime(mod, target_spec, checker, finalists, final_rounds)
    return row


def _tune(mod, target_spec, model, tok, work, checker, trials: int, cost=None, oversample: int = 1) -> dict:
    """`little-dragon tune`: the model's scripts, refined round after round (with `cost`, a cost
    model choosing among `oversample` times each batch)."""
    from pipeline.tune import Tuner

    start = time.perf_counter()
    cm = cost() if cost else None
    load_s = time.perf_counter() - start     # pre-training (first task) or its copy, not the tune
    pretrained_on = cm.size if cm else None
    start = time.perf_counter()
    r = Tuner(mod, target_spec, model, tok, work, checker=checker, cost_model=cm,
              oversample=oversample).run(trials, progress=False)
    out = {"seconds": round(time.perf_counter() - start, 1), "generation_seconds": round(r.generation_seconds, 1),
           "curve": r.curve, "measured": r.measured, "written": r.written, "correct": r.correct, "rounds": r.rounds,
           "baseline_s": r.baseline_s, "stopped": r.stopped, "sampled": r.sampled}
    if cm:
        out.update(pretrained_on=pretrained_on, cost_model_load_seconds=round(load_s, 1),
                   trained_on_after_tune=cm.trained_on)
    return out


def _inside(mod, target, target_spec, trials: int, sp, checker, work, name: str, model, cost, focus: int = 1,
            library=None, rank: str = "cost", eps_greedy: float | None = None, ranker: bool = False) -> dict:
    """MetaSchedule's own tuning at `trials`: with `model` (a loaded pair), ModelFirst (the
    model's batch, then the evolutionary search); with `library`, ModelFirst whose batch the
    library carries over from other workloads; else the evolutionary search alone. With
    `cost`, the search ranks by the pre-trained cost model (`CostModel.as_metaschedule`);
    `eps_greedy`: the evolutionary search's share of random picks (None: MetaSchedule's 0.05);
    `ranker`: the search ranks by pipeline.rank_model on the cost model's data instead."""
    from pipeline import metaschedule
    from pipeline.model_strategy import ModelFirst
    from pipeline.tvm_env import ms

    start = time.perf_counter()
    from pipeline.rank_model import for_search

    xgb = for_search(cost(train=False), focus, ranker) if cost else None   # either trains its own
    load_s = time.perf_counter() - start
    if model is not None or library is not None:
        strategy = ModelFirst(model, batch=max(1, trials // 2), population_size=sp.population_size,
                              genetic_num_iters=sp.genetic_num_iters, proposer=library, rank=rank)
    else:
        strategy = ms.search_strategy.EvolutionarySearch(
            population_size=sp.population_size, genetic_num_iters=sp.genetic_num_iters,
            **({} if eps_greedy is None else {"eps_greedy": eps_greedy}))
    tuned = metaschedule.tune(mod, target, trials, work, sp, name, strategy=strategy, cost_model=xgb)
    out = _retimed(tuned, mod, target_spec, checker)
    if model is not None:
        out["from_model"] = len(strategy.proposed)
    if library is not None:
        out["transferred_from"] = list(strategy.proposed)
    if cost:
        out["cost_model_load_seconds"] = round(load_s, 1)
    return out


def _retimed(tuned, mod, target_spec, checker) -> dict:
    """MetaSchedule's candidates, in its order, re-timed by the checker that timed the model's.
    `_candidates` (dropped before the row is written): (script, latency) in that order, for the
    finalists' re-timing (`final_retime`)."""
    start = time.perf_counter()
    scripts = [s for s in tuned.scripts if s is not None]
    timed = dict(zip(scripts, checker.check_many(mod, scripts, target_spec, timed=True)))
    lat = [timed[s].latency_s if s is not None and timed[s].correct else None for s in tuned.scripts]
    return {"seconds": round(tuned.seconds, 1), "retime_seconds": round(time.perf_counter() - start, 1),
            "curve": _best_curve(lat), "measured": len(lat), "correct": sum(x is not None for x in lat),
            "_candidates": list(zip(tuned.scripts, lat))}


def best_of_first(candidates: list[tuple], k: int) -> str | None:
    """The script a tuner stopped after `k` candidates hands its user: the fastest correct one
    of its first `k` as they were timed (None if none was correct)."""
    timed = [(lat, i) for i, (script, lat) in enumerate(candidates[:k]) if script is not None and lat is not None]
    return candidates[min(timed)[1]][0] if timed else None


def final_retime(mod, target_spec, checker, finalists: dict[str, str | None], rounds: int) -> dict:
    """Each finalist (a contender's `best_of_first`) timed again `rounds` times, the contenders
    taking turns round after round so slow drifts of the machine fall on all alike; a
    contender's figure is the median of its rounds. A best of many single timings is biased
    low (the fastest of 64 noisy timings is luckier than the fastest of 16); these are not.
    On a CPU target no build runs beside a timing (`Checker.alone`): a kernel timed while the
    checker's other worker compiles the next finalist shares the cores with the compiler."""
    from statistics import median

    unique = sorted({s for s in finalists.values() if s is not None})
    start = time.perf_counter()
    with checker.alone_on_cpu(target_spec) as alone:
        outcomes = checker.check_many(mod, unique * rounds, target_spec, timed=True)
    samples = {s: [] for s in unique}
    for s, o in zip(unique * rounds, outcomes):
        if o.correct and o.latency_s is not None:
            samples[s].append(o.latency_s)
    latency = {k: (median(samples[s]) if s is not None and samples[s] else None) for k, s in finalists.items()}
    spread = {k: [min(samples[s]), max(samples[s])] if s is not None and samples[s] else None
              for k, s in finalists.items()}
    return {"rounds": rounds, "seconds": round(time.perf_counter() - start, 1), "latency_s": latency,
            "spread_s": spread, "scripts": finalists, "builds_beside_timings": not alone}


LABELS = {"model": "model (tune)", "model_cost": "model + cost model (tune)", "metaschedule": "MetaSchedule",
          "model_first": "model first, then MetaSchedule",
          "model_first_cost": "model first, then MetaSchedule with the pre-trained cost model",
          "ms_cost": "MetaSchedule with the pre-trained cost model",
          "ms_cost_eps": "MetaSchedule with the pre-trained cost model, a share of each round at random",
          "ms_rank": "MetaSchedule with the pre-trained ranking model",
          "transfer_first_cost": "campaign scripts carried over first, then MetaSchedule with the pre-trained cost model"}


class _Tally:
    """Per contender: the tasks it ran on, those where its latency was <= the yardstick's, and
    its ratios to it (a task where either has no correct kernel is a miss, out of the geomean)."""

    def __init__(self):
        self.ran, self.wins, self.ratios = {}, {}, {}

    def add(self, name: str, latency: float | None, yardstick: float | None) -> tuple[float | None, bool]:
        """(latency / yardstick or None, whether it is <= it)."""
        ok = latency is not None and yardstick is not None
        win = ok and latency <= yardstick
        self.ran[name] = self.ran.get(name, 0) + 1
        self.wins[name] = self.wins.get(name, 0) + win
        if ok:
            self.ratios.setdefault(name, []).append(latency / yardstick)
        return (latency / yardstick if ok else None), win

    def write(self, out: dict, prefix: str, trials: int, ms_trials: int) -> None:
        for name, n in self.wins.items():
            out[f"{prefix}{name}@{trials}_le_ms@{ms_trials}"] = n
            out[f"{prefix}{name}_tasks"] = self.ran[name]     # the tasks it ran on (a run may leave a variant out)
            out[f"{prefix}{name}_geomean_ratio_to_ms@{ms_trials}"] = geomean(self.ratios.get(name, []))


def summarize(rows: list[dict], trials: int, ms_trials: int) -> dict:
    """Per variant: on how many tasks its best after `trials` is <= MetaSchedule's after
    `ms_trials`, and the geomean of that ratio (a task where either has no correct kernel
    counts as a miss and stays out of the geomean); the same for the finalists timed again
    (`final_retime`), keys prefixed `final_`."""
    def at(curve, k):
        return curve[min(k, len(curve)) - 1] if curve else None

    per, single, final_tally = [], _Tally(), _Tally()
    for row in rows:
        s = row["metaschedule"]["curve"]
        ms_full = at(s, ms_trials)
        task = {"task": row["task"], f"ms@{trials}": at(s, trials), f"ms@{ms_trials}": ms_full,
                "ms_seconds": row["metaschedule"]["seconds"]}
        for key in VARIANTS:
            if key not in row:
                continue
            best = at(row[key]["curve"], trials)
            ratio, win = single.add(key, best, ms_full)
            task.update({f"{key}@{trials}": best, f"ratio_{key}_to_ms_full": ratio,
                         f"{key}_le_ms_full": win, f"{key}_seconds": row[key]["seconds"]})
        final = row.get("final", {}).get("latency_s", {})
        ms_final = final.get(f"metaschedule@{ms_trials}")
        for key, lat in final.items():
            if key != f"metaschedule@{ms_trials}":
                name = "ms" if key == f"metaschedule@{trials}" else key
                task[f"final_ratio_{name}_to_ms_full"] = final_tally.add(name, lat, ms_final)[0]
        if "model" in row:
            m = row["model"]["curve"]
            task["model_trials_to_ms_full"] = next(
                (i + 1 for i, x in enumerate(m) if x is not None and ms_full is not None and x <= ms_full), None)
        per.append(task)
    # rows of several runs (sessions) may repeat a task: each is compared with its own run's MetaSchedule
    out = {"tasks": len({row["task"] for row in rows}), "runs": len(rows), "trials": trials, "ms_trials": ms_trials,
           "target_fraction": 0.7}
    single.write(out, "", trials, ms_trials)
    if "model" in single.wins:
        out["fraction"] = single.wins["model"] / single.ran["model"]
    final_tally.write(out, "final_", trials, ms_trials)
    ms_ratio = [t[f"ms@{trials}"] / t[f"ms@{ms_trials}"] for t in per if t[f"ms@{trials}"] and t[f"ms@{ms_trials}"]]
    out[f"ms@{trials}_geomean_ratio_to_ms@{ms_trials}"] = geomean(ms_ratio)
    out["per_task"] = per
    return out


def plot(rows: list[dict], path: str):
    """Latency against measured candidates, a panel a task, one legend below them; the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    cols = min(4, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4 * cols, 3 * ((n + cols - 1) // cols)), squeeze=False)
    for ax, row in zip(axes.flat, rows):
        for color, (key, label) in enumerate(LABELS.items()):      # a variant keeps its colour in every panel
            if key not in row:
                continue
            curve = row[key]["curve"]
            xs = [i + 1 for i, y in enumerate(curve) if y is not None]
            ax.plot(xs, [curve[i - 1] * 1e6 for i in xs], label=label, color=f"C{color}")
            # the finalists timed again (`final_retime`): a star at the candidates each had, its median
            final = row.get("final", {}).get("latency_s", {})
            for name, lat in final.items():
                if lat is not None and (name == key or name.startswith(f"{key}@")):
                    at = int(name.split("@")[1]) if "@" in name else len(curve)
                    ax.plot([at], [lat * 1e6], marker="*", markersize=9, linestyle="none", color=f"C{color}",
                            label="finalist timed again (median)", markeredgecolor="black", markeredgewidth=0.5)
        ax.set_title(row["task"] + (f" (session {row['session']})" if "session" in row else ""))
        ax.set_xlabel("measured candidates")
        ax.set_ylabel("best latency (us)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    labels = {}                      # one legend for every variant drawn, whichever panel has it
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labels.setdefault(label, handle)
    # one panel is too narrow for three entries a row: one a row, and room below the panels for them
    ncol = min(3 if cols > 1 else 1, len(labels)) or 1
    fig.legend(labels.values(), labels.keys(), loc="lower center", ncol=ncol, fontsize="small")
    legend_rows = -(-len(labels) // ncol)
    fig.tight_layout(rect=(0, max(0.1, (0.25 * legend_rows + 0.1) / fig.get_figheight()), 1, 1))
    fig.savefig(path, dpi=110)
    return fig


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
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                    help="what runs beside MetaSchedule@--ms-trials (default: all)")
    ap.add_argument("--inside-per-iter", type=int, default=None,
                    help="candidates a round for the variants inside MetaSchedule (model_first*, ms_cost; "
                         "default: MetaSchedule's 16): fewer, more rounds that learn from this kernel's measurements")
    ap.add_argument("--focus", type=int, default=1,
                    help="the pre-trained cost model inside MetaSchedule (ms_cost, model_first_cost) counts the "
                         "kernel's own measurements this many times in each retraining (default 1: as one more workload)")
    ap.add_argument("--inside-search", default=None, metavar="POPxGENS",
                    help="population and generations of the evolutionary search of the variants inside MetaSchedule "
                         "(e.g. 2048x8: a pre-trained cost model searched harder for the same measurements; "
                         "default: the yardstick's 512x4)")
    ap.add_argument("--transfer-rank", default="cost", choices=("cost", "nearest"),
                    help="which carried-over scripts transfer_first_cost measures first: the pre-trained cost "
                         "model's best, or the least changed by the carrying, one per source workload")
    ap.add_argument("--final-retime", type=int, default=0, metavar="ROUNDS",
                    help="time each contender's finalist (its fastest of its first --trials, MetaSchedule's also of "
                         "its --ms-trials) again ROUNDS times, taking turns, and compare their medians too "
                         "(default 0: not; the model's own tune variants have no finalist)")
    ap.add_argument("--eps-greedy", type=float, default=0.25,
                    help="ms_cost_eps: the share of each round picked at random rather than by the pre-trained "
                         "cost model (MetaSchedule's own: 0.05, which in a round of 8 picks none)")
    ap.add_argument("--cost-data", default=None,
                    help="a search work folder to pre-train the cost model on (default: the target's campaign in "
                         "databases/; none: it learns from each tune's measurements only)")
    args = ap.parse_args()
    if args.focus < 1:
        ap.error(f"--focus must be >= 1 (got {args.focus})")
    if args.final_retime < 0:
        ap.error(f"--final-retime must be >= 0 (got {args.final_retime})")
    if not 0.0 <= args.eps_greedy <= 1.0:
        ap.error(f"--eps-greedy must be within [0, 1] (got {args.eps_greedy})")
    inside_search = None
    if args.inside_search:
        try:
            inside_search = tuple(int(x) for x in args.inside_search.lower().split("x"))
        except ValueError:
            inside_search = ()
        if len(inside_search) != 2 or min(inside_search) < 1:
            ap.error(f"--inside-search takes POPxGENS, two positive integers (got {args.inside_search!r})")
    import yaml

    from pipeline import files, models, params as P
    from pipeline.stages.search import SearchParams
    from pipeline.verify import Checker

    raw = yaml.safe_load(Path(args.params).read_text())
    # MetaSchedule at its own defaults (population 512 x 4 generations), 16 candidates a round so
    # its cost model learns over the 64: the strongest MetaSchedule this budget allows
    sp = dataclasses.replace(P.from_dict(SearchParams, raw["search"], "search"), population_size=512,
                             genetic_num_iters=4, trials_per_iter=16)
    needs_model = set(args.variants) & {"model", "model_cost", "model_first", "model_first_cost"}
    model, tok = models.load(args.model) if needs_model else (None, None)
    checker = Checker(timeout_s=120, workers=args.checker_workers)
    from pipeline import cost_model

    pretrained = []       # pre-trained once; each task's tune gets its own copy

    def cost(train: bool = True):
        if args.cost_data == "none":
            return cost_model.CostModel(raw["search"]["target"])
        if not pretrained:
            pretrained.append(cost_model.for_target(raw["search"]["target"], args.cost_data)[0])
        return pretrained[0].copy(train)

    libraries = []        # the transfer library, loaded once

    def library():
        from pipeline import transfer

        if not libraries:
            libraries.append(transfer.Library(raw["search"]["target"], None) if args.cost_data == "none"
                             else transfer.Library.for_target(raw["search"]["target"], args.cost_data))
        return libraries[0]

    rows = []
    for item in args.tasks:
        rows.append(run_task(item, model, tok, raw["search"]["target"], args.trials, args.ms_trials, sp, checker,
                             args.oversample, cost, args.variants, args.inside_per_iter, args.focus, inside_search,
                             library, args.transfer_rank, args.final_retime, args.eps_greedy))
        summary = summarize(rows, args.trials, args.ms_trials)
        files.write_json(args.out, {"model": args.model if needs_model else None, "target": raw["search"]["target"],
                                    "inside_per_iter": args.inside_per_iter or sp.trials_per_iter, "focus": args.focus,
                                    "inside_search": list(inside_search or (sp.population_size, sp.genetic_num_iters)),
                                    "transfer_rank": args.transfer_rank, "final_retime": args.final_retime,
                                    "eps_greedy": args.eps_greedy if "ms_cost_eps" in args.variants else None,
                                    # the latest task's end: tune_history's order (kept after every task)
                                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **summary, "rows": rows})
        print(summary["per_task"][-1], flush=True)
    plot(rows, str(Path(args.out).with_suffix(".png")))
    s = summarize(rows, args.trials, args.ms_trials)
    line = "; ".join(f"{LABELS[k]}@{args.trials}: {s[f'{k}@{args.trials}_le_ms@{args.ms_trials}']}/{s[f'{k}_tasks']}"
                     f" (geomean {s[f'{k}_geomean_ratio_to_ms@{args.ms_trials}'] or float('nan'):.2f})"
                     for k in VARIANTS if f"{k}@{args.trials}_le_ms@{args.ms_trials}" in s)
    print(f"<= MetaSchedule@{args.ms_trials}: {line} -> {args.out}")
    final = "; ".join(f"{k}@{args.trials}: {s[f'final_{k}@{args.trials}_le_ms@{args.ms_trials}']}/{s[f'final_{k}_tasks']}"
                      f" (geomean {s[f'final_{k}_geomean_ratio_to_ms@{args.ms_trials}'] or float('nan'):.2f})"
                      for k in ("ms", *VARIANTS) if f"final_{k}_tasks" in s)
    if final:
        print(f"finalists timed again {args.final_retime} times, medians <= MetaSchedule@{args.ms_trials}'s: {final}")


if __name__ == "__main__":
    main()
