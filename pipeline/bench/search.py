"""Benchmark: search throughput (measured candidates per minute) and where the time goes.

    python -m pipeline.bench.search --params profiles/gpu.yaml --variants stock persistent \
        [--workloads 4] [--trials 32] [--out reports/bench_search.json]

Each variant runs the search stage's own code from scratch in a temporary folder on the same
workloads (the first ones the profile's search would tune): `stock` is TVM's LocalBuilder (a
fresh pool of worker processes each round), `persistent` the project's PoolBuilder, `overlap`
that pool building and the GPU measuring beside the search (pipeline/overlap.py). Optional
`key=value` overrides follow a variant's name: `persistent:min_repeat_ms=40`. Phases: build,
measuring (inside Runner.run), waiting for the runner, the rest (search strategy, cost model,
database); with overlap also the wall time with builds in flight and with the GPU measuring.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tempfile
import time

import yaml

VARIANTS = {"stock": {"persistent_builder": False}, "persistent": {"persistent_builder": True},
            "overlap": {"persistent_builder": True, "overlap": True}}


def machine() -> dict:
    """The search archive's machine record (GPUs, driver, nvcc, versions) plus the cores this
    process may use (a `taskset` narrows them to one H200's share)."""
    from pipeline.archive import machine as archive_machine

    return {**archive_machine(), "cpus_usable": len(os.sched_getaffinity(0))}


def parse_variant(text: str) -> tuple[str, dict]:
    name, *over = text.split(":")
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}; choose from {sorted(VARIANTS)}")
    values = dict(VARIANTS[name])
    for kv in over:
        k, v = kv.split("=", 1)
        values[k] = yaml.safe_load(v)
    return text, values


def scheduler_errors(work_dir: str) -> int:
    """How often TVM's task scheduler raised in the run (each time its shard's pending workloads
    are tuned again one at a time: time outside the tuned rounds)."""
    from pathlib import Path

    from pipeline import files

    return sum(e.get("stage") == "scheduler" for path in Path(work_dir).rglob("errors.jsonl")
               for e in files.read_jsonl(path))


def best_ratio(best: dict, first: dict) -> float | None:
    """Geomean over the workloads both runs found a latency for of this run's best / the first
    run's best (< 1: this variant found faster kernels)."""
    both = [(best[k], first[k]) for k in best if best.get(k) and first.get(k)]
    if not both:
        return None
    return round(math.exp(sum(math.log(a / b) for a, b in both) / len(both)), 4)


def outside_parts(row: dict) -> float | None:
    """Seconds of the run outside its longest part's own time (tuning, failed tuning runs, the
    baselines it waited for): process start-up, TVM imports, build pools starting and stopping.
    A campaign pays them once; a short benchmark run pays them in its candidates per minute."""
    parts = row.get("parts") or []
    if not parts or not row.get("seconds"):
        return None
    longest = max(q.get("seconds", 0) + q.get("failed_run_s", 0) + q.get("baseline_s", 0) for q in parts)
    return round(max(0.0, row["seconds"] - longest), 1)


def run(params_path: str, variants: list[str], workloads: int, trials: int, stop_after: float | None = None,
        out_path: str | None = None) -> dict:
    from pipeline import params as P
    from pipeline.stages.search import SearchParams, run_search

    base = P.load("search", SearchParams, params_path)
    out = {"machine": machine(), "params": params_path, "workloads": workloads, "trials_per_workload": trials,
           "runs": []}
    for text in variants:
        name, over = parse_variant(text)
        with tempfile.TemporaryDirectory() as tmp:
            # a variant may set any search param, trials_per_iter included
            p = dataclasses.replace(base, **{"trials_per_iter": min(base.trials_per_iter, trials), **over,
                                             "num_workloads": workloads, "trials_per_workload": trials,
                                             "work_dir": f"{tmp}/search", "report": f"{tmp}/search.json",
                                             "archive_dir": None})
            summary = run_search(p, progress=False, stop_after=stop_after)
            errors = scheduler_errors(f"{tmp}/search")
        row = {"variant": name, "builder_workers": p.builder_workers, "devices": p.devices,
               "min_repeat_ms": p.min_repeat_ms, **summary["this_run"],
               "failed_trials": summary["failed_trials"], "trials": summary["trials"],
               "scheduler_errors": errors, "failed_workloads": len(summary["failed_workloads"]),
               # what the search found, so that a faster variant shows what it costs in quality
               "speedup_geomean_vs_baseline": summary["speedup_geomean_vs_baseline"],
               "best_s": {r["id"]: r["best_s"] for r in summary["per_workload"]}}
        row["outside_parts_s"] = outside_parts(row)
        row["best_vs_first_run"] = best_ratio(row["best_s"], out["runs"][0]["best_s"]) if out["runs"] else None
        out["runs"].append(row)
        print({k: v for k, v in row.items() if k not in ("parts", "best_s")}, row["parts"], flush=True)
        if out_path:     # each variant's figures kept as soon as it ends (a device call may be cut)
            from pipeline import files

            out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")    # the latest run's end (search_history's order)
            files.write_json(out_path, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--variants", nargs="+", default=["stock", "persistent"])
    ap.add_argument("--workloads", type=int, default=4)
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                    help="a variant starts no new shard after SECONDS (its figures cover what it measured)")
    ap.add_argument("--out", default="reports/bench_search.json")
    args = ap.parse_args()

    run(args.params, args.variants, args.workloads, args.trials, args.stop_after, args.out)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
