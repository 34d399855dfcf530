"""Benchmark: where MetaSchedule's own search time goes in a CUDA search, with the builds and
the GPU stood in, so that only the scheduler's side is left (the critical path of an
overlapped search on the H200: `other_s` of its parts).

    python -m pipeline.bench.strategy --params profiles/gpu.yaml [--workloads 4] [--trials 32] \
        [--variants 256x2 256x2/16 128x2/16 128x2/16@32] [--threads N] [--out reports/bench_strategy_cpu.json]

Real: the CUDA target, the search stage's first workloads (one shard: the first part of the
H200 benchmark's 8), its design space, ReplayFirst + evolutionary search, MetaSchedule's XGBoost
cost model trained after every round, the database and the measure callbacks. Stood in: the
builder (an empty artifact folder per candidate, no compile) and the GPU (a random latency at
once), so what the strategy finds means nothing; its time per candidate is what is measured.
Each variant is `POPxGENS[/MIN][@PER]` (population size x genetic iterations of the evolutionary search,
MIN: the valid random samples a round needs, `search.init_min_unmeasured`; PER: candidates a round,
`search.trials_per_iter`, capped by `--trials`: a round's search costs about the same whatever it
picks, so more a round is less scheduler time a candidate, and fewer rounds evolved from measurements);
MetaSchedule's Profiler says which of its scopes took the time (`profile`, seconds; plotted
beside the JSON, `.png`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

from pipeline.tvm_env import ms, tvm


def artifact_path() -> str:
    """A stand-in artifact's path, in a fresh folder of its own: MetaSchedule's
    RemoveBuildArtifact removes the artifact's *parent* folder after the round (a folder made
    straight under the temporary directory once took the whole of /tmp with it)."""
    return os.path.join(tempfile.mkdtemp(prefix="ld-nobuild-"), "none.so")


@tvm.ir.utils.derived_object
class NoBuild(ms.builder.PyBuilder):
    """Every candidate 'built' at once, to an `artifact_path()`."""

    def build(self, build_inputs):
        return [ms.builder.BuilderResult(artifact_path(), None) for _ in build_inputs]


def parse_variant(text: str) -> tuple[int, int, int | None, int | None]:
    """`POPxGENS[/MIN][@PER]` (MIN: init_min_unmeasured, PER: trials_per_iter; default the params')."""
    try:
        rest, at, per_text = text.lower().partition("@")
        head, slash, floor = rest.partition("/")
        pop, gens = (int(x) for x in head.split("x"))
        least = int(floor) if slash else None
        per = int(per_text) if at else None
    except ValueError:
        raise SystemExit(f"variant {text!r}: expected POPxGENS[/MIN][@PER], e.g. 256x2, 256x2/16 or 128x2/16@32") from None
    if pop < 1 or gens < 0 or (least is not None and least < 1) or (per is not None and per < 1):
        raise SystemExit(f"variant {text!r}: population must be >= 1, generations >= 0, MIN and PER >= 1")
    return pop, gens, least, per


def run(params_path: str, variants: list[str], workloads: int, trials: int, threads: int | None,
        out_path: str | None, only: list[str] | None = None) -> dict:
    from pipeline import files, params as P, tuning
    from pipeline.bench.search import machine
    from pipeline.bench.search_overlap import StandInGPU
    from pipeline.stages.search import SearchParams, select_workloads
    from pipeline.workloads import build

    base = P.load("search", SearchParams, params_path)
    p = dataclasses.replace(base, num_workloads=workloads, trials_per_workload=trials,
                            trials_per_iter=min(base.trials_per_iter, trials))
    specs = select_workloads(p)
    if only:
        unknown = sorted(set(only) - {s.id for s in specs})
        if unknown:
            raise SystemExit(f"--only: {', '.join(unknown)} not among the first {workloads} workloads")
        specs = [s for s in specs if s.id in only]
    target = tvm.target.Target(p.target)
    threads = threads or min(p.builder_workers, len(os.sched_getaffinity(0)))
    out = {"machine": machine(), "params": params_path, "workloads": [s.id for s in specs],
           "trials_per_workload": trials, "trials_per_iter": p.trials_per_iter, "first_round": p.first_round,
           "num_threads": threads, "runs": []}
    mods = [(s.id, build(s)) for s in specs]
    for text in variants:
        pop, gens, least, per = parse_variant(text)
        per = min(per or p.trials_per_iter, trials)
        # the strategy's threads: TuneContext.num_threads, which tuning.tune takes from builder_workers
        v = dataclasses.replace(p, population_size=max(pop, per), genetic_num_iters=gens, trials_per_iter=per,
                                init_min_unmeasured=least or p.init_min_unmeasured, builder_workers=threads)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            with ms.Profiler() as prof:     # the GPU stood in as search_overlap's, taking no time
                tuning.tune(v, target, mods, tmp, trials, v.trials_per_iter, logger="bench", pool=NoBuild(),
                            runner=StandInGPU(0.0, seed=v.seed))
            seconds = time.perf_counter() - start
            measured = len(ms.database.JSONDatabase(work_dir=tmp))
        profile = {k: round(float(s), 2) for k, s in sorted(prof.get().items(), key=lambda kv: -float(kv[1]))}
        row = {"variant": text, "population_size": v.population_size, "genetic_num_iters": gens,
               "init_min_unmeasured": v.init_min_unmeasured, "trials_per_iter": per,
               "measured": measured, "seconds": round(seconds, 1),
               "seconds_per_candidate": round(seconds / max(measured, 1), 3),
               "candidates_per_min": round(60 * measured / seconds, 1), "profile": profile}
        out["runs"].append(row)
        print({k: row[k] for k in row if k != "profile"}, flush=True)
        print("  " + ", ".join(f"{k} {s}" for k, s in list(profile.items())[:8]), flush=True)
        if out_path:
            files.write_json(out_path, out)
            plot(out, os.path.splitext(out_path)[0] + ".png")
    return out


def plot(out: dict, path: str) -> None:
    """Seconds a candidate per variant, split into the Profiler's scopes (the 5 largest over all
    variants; the rest together)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = out["runs"]
    totals: dict[str, float] = {}
    for r in runs:
        for k, v in r["profile"].items():
            if k != "Total":
                totals[k] = totals.get(k, 0.0) + v
    top = sorted(totals, key=totals.get, reverse=True)[:5]
    fig, ax = plt.subplots(figsize=(1.6 * len(runs) + 5, 3.6))
    names = [f"{r['variant']}\n({i + 1})" for i, r in enumerate(runs)]
    bottom = [0.0] * len(runs)
    for color, key in enumerate([*top, "other"]):
        ys = []
        for r in runs:
            n = max(r["measured"], 1)
            if key == "other":
                ys.append(max(0.0, r["seconds"] - sum(r["profile"].get(k, 0.0) for k in top)) / n)
            else:
                ys.append(r["profile"].get(key, 0.0) / n)
        ax.bar(names, ys, bottom=bottom, label=key.replace("EvoSearch/", ""), color=f"C{color}")
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_ylabel("scheduler seconds a candidate")
    ax.set_title(f"MetaSchedule's own time, {len(out['workloads'])} workloads x {out['trials_per_workload']}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="profiles/gpu.yaml")
    ap.add_argument("--variants", nargs="+", default=["256x2", "256x2/16", "128x2/16"])
    ap.add_argument("--workloads", type=int, default=4)
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="the strategy's threads (default: the profile's "
                    "build workers, capped by the cores)")
    ap.add_argument("--only", nargs="+", default=None, help="of the first --workloads, only these ids")
    ap.add_argument("--out", default="reports/bench_strategy_cpu.json")
    args = ap.parse_args()
    if args.workloads < 1 or args.trials < 1 or (args.threads is not None and args.threads < 1):
        raise SystemExit("--workloads, --trials and --threads must be >= 1")
    for text in args.variants:
        parse_variant(text)
    run(args.params, args.variants, args.workloads, args.trials, args.threads, args.out, args.only)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
