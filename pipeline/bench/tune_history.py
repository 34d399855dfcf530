"""Issue #15's yardstick over every run so far: each contender's latency at 16 measured
candidates over MetaSchedule's at 64 in the same run, per kernel and per network, from the
committed `reports/bench_tune_*.json` (pipeline.bench.tune) and `reports/bench_tune_model_*.json`
(pipeline.bench.tune_model), as one table and one plot.

    python -m pipeline.bench.tune_history [--out reports/tune_results]

Where a run timed its finalists again (`--final-retime R`) the medians are used, otherwise the
single timings (the table says which). Writes `<out>.md`: one row a run and contender, a column a
task, then each contender's tally over all its runs against the target (<= 1.0 on >= 70% of the
tasks); and `<out>.png`: the ratios per task, one panel per target and kind.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from pipeline.bench import write_history
from pipeline.bench.search_history import _added
from pipeline.stats import geomean

TARGET_FRACTION = 0.7
_KERNEL = re.compile(r"^(final_)?ratio_(.+)_to_ms_full$")
_NETWORK = re.compile(r"^(final_)?(.+)_over_ms$")


def _target(out: dict) -> str:
    t = out.get("target")
    kind = t if isinstance(t, str) else (t or {}).get("kind", "?")
    return "cuda" if "nvidia" in str(kind) or kind == "cuda" else "cpu" if kind == "llvm" else str(kind)


def _ratios(items: list[dict], name_key: str, pattern: re.Pattern) -> dict[str, dict[str, tuple[float, bool]]]:
    """variant -> task -> (ratio, re-timed): the re-timed median where the run has one."""
    out: dict[str, dict[str, tuple[float, bool]]] = {}
    for item in items:
        for key, value in item.items():
            m = pattern.match(key)
            if not m or not isinstance(value, (int, float)) or value <= 0:
                continue
            final, variant = bool(m.group(1)), m.group(2)
            if variant == "ms":          # MetaSchedule's own first 16: _own_first
                continue
            have = out.setdefault(variant, {}).get(item[name_key])
            if have is None or (final and not have[1]):
                out[variant][item[name_key]] = (float(value), final)
    return out


def _settings(out: dict, variant: str) -> str:
    """How a MetaSchedule-inside contender searched, where it differs from the benchmark's default
    (one round of 16, MetaSchedule's 512 x 4): runs of different settings are tallied apart."""
    if variant not in ("ms_cost", "ms_cost_eps", "ms_rank", "transfer_first_cost"):
        return variant
    parts = []
    if out.get("inside_per_iter"):
        parts.append(f"rounds of {out['inside_per_iter']}")
    if (out.get("focus") or 1) > 1:
        parts.append(f"focus {out['focus']}")
    if out.get("inside_search") and list(out["inside_search"]) != [512, 4]:
        parts.append("search {}x{}".format(*out["inside_search"]))
    if variant == "ms_cost_eps" and out.get("eps_greedy") is not None:
        parts.append(f"eps {out['eps_greedy']}")
    if variant == "transfer_first_cost" and out.get("transfer_rank", "cost") != "cost":
        parts.append(f"rank {out['transfer_rank']}")
    return f"{variant} ({', '.join(parts)})" if parts else variant


def _own_first(items: list[dict]) -> dict[str, tuple[float, bool]]:
    """MetaSchedule's own first 16 over its 64 (the yardstick's own spread), where the run kept it."""
    out = {}
    for item in items:
        if isinstance(item.get("final_ratio_ms_to_ms_full"), (int, float)):
            out[item["task"]] = (float(item["final_ratio_ms_to_ms_full"]), True)
        elif item.get("ms@16") and item.get("ms@64"):
            out[item["task"]] = (item["ms@16"] / item["ms@64"], False)
    return out


def runs(reports: Path) -> list[dict]:
    """One row per run and contender: its ratios per task, time-ordered."""
    rows = []
    for path in sorted(reports.glob("bench_tune_*.json")):
        out = json.loads(path.read_text())
        network = "networks" in out
        items = out.get("networks" if network else "per_task") or []
        found = _ratios(items, "network" if network else "task", _NETWORK if network else _KERNEL)
        if not network and (own := _own_first(items)):
            found["MetaSchedule's own first 16"] = own
        when = out.get("finished") or _added(path)
        for variant, tasks in found.items():
            rows.append({"time": when, "source": path.name, "target": _target(out),
                         "kind": "network" if network else "kernel", "variant": _settings(out, variant),
                         "ratios": {t: r for t, (r, _) in tasks.items()},
                         "retimed": all(f for _, f in tasks.values())})
    return sorted(rows, key=lambda r: (r["target"], r["kind"], r["time"], r["source"], r["variant"]))


def tally(rows: list[dict]) -> list[dict]:
    """Per target, kind, contender and timing (re-timed medians or single timings): tasks at or
    under MetaSchedule@64 over all its runs."""
    out: dict[tuple, dict] = {}
    every: dict[tuple, set] = {}          # the tasks any run of a target and kind measured
    for r in rows:
        every.setdefault((r["target"], r["kind"]), set()).update(r["ratios"])
        timing = "re-timed" if r["retimed"] else "single"
        t = out.setdefault((r["target"], r["kind"], r["variant"], timing),
                           {"target": r["target"], "kind": r["kind"], "variant": r["variant"], "timing": timing,
                            "wins": 0, "tasks": 0, "runs": 0, "ratios": [], "covered": set()})
        t["runs"] += 1
        t["covered"] |= set(r["ratios"])
        t["tasks"] += len(r["ratios"])
        t["wins"] += sum(v <= 1.0 for v in r["ratios"].values())
        t["ratios"] += r["ratios"].values()
    for t in out.values():
        ratios, covered = t.pop("ratios"), t.pop("covered")
        t["fraction"] = t["wins"] / t["tasks"] if t["tasks"] else None
        t["geomean"] = geomean(ratios)
        # judged only where the contender's runs cover every task: 1 of 1 is not 70% of the tasks
        t["covers"] = f"{len(covered)}/{len(every[(t['target'], t['kind'])])}"
        t["meets_target"] = (None if covered != every[(t["target"], t["kind"])]
                             else t["fraction"] is not None and t["fraction"] >= TARGET_FRACTION)
    return sorted(out.values(), key=lambda t: (t["target"], t["kind"], t["timing"], -(t["fraction"] or 0), t["variant"]))


def table(rows: list[dict]) -> str:
    lines = ["# Model-guided tuning against MetaSchedule, run by run (issue #15)", "",
             "Generated by `python -m pipeline.bench.tune_history` from every `reports/bench_tune_*.json`. "
             "Each cell: the contender's best latency at 16 measured candidates / MetaSchedule's best at 64 in the "
             "same run (< 1: the contender is faster; **bold**: at or under 1.0). Re-timed: the finalists' medians "
             f"of R rounds side by side (`--final-retime R`); otherwise single timings. Target: <= 1.0 on >= "
             f"{TARGET_FRACTION:.0%} of the tasks.", ""]
    for (target, kind) in sorted({(r["target"], r["kind"]) for r in rows}):
        group = [r for r in rows if (r["target"], r["kind"]) == (target, kind)]
        tasks = sorted({t for r in group for t in r["ratios"]})
        lines += [f"## {target.upper()} {kind}s", "",
                  "| run | contender | timing | " + " | ".join(tasks) + " | <= 1.0 |",
                  "| --- | --- | --- | " + " | ".join("---" for _ in tasks) + " | --- |"]
        for r in group:
            cells = [("" if t not in r["ratios"] else
                      f"**{r['ratios'][t]:.3f}**" if r["ratios"][t] <= 1.0 else f"{r['ratios'][t]:.3f}") for t in tasks]
            wins = sum(v <= 1.0 for v in r["ratios"].values())
            lines.append(f"| `{r['source']}` | {r['variant']} | {'re-timed' if r['retimed'] else 'single'} | "
                         + " | ".join(cells) + f" | {wins}/{len(r['ratios'])} |")
        lines.append("")
    lines += ["## Tally over all runs", "",
              "| target | kind | timing | contender | runs | tasks covered | at or under MetaSchedule@64 | geomean ratio "
              "| target met |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in tally(rows):
        met = {True: "yes", False: "no", None: "not judged (not every task)"}[t["meets_target"]]
        lines.append(f"| {t['target']} | {t['kind']} | {t['timing']} | {t['variant']} | {t['runs']} | {t['covers']} | "
                     f"{t['wins']}/{t['tasks']} ({t['fraction']:.1%}) | {t['geomean']:.3f} | {met} |")
    return "\n".join(lines + [""])


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["target"], r["kind"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 5.0), squeeze=False)
    colors = {v: f"C{i % 10}" for i, v in enumerate(sorted({r["variant"] for r in rows if r["retimed"]}))}
    for ax, (target, kind) in zip(axes[0], groups):
        group = [r for r in rows if (r["target"], r["kind"]) == (target, kind)]
        tasks = sorted({t for r in group for t in r["ratios"]})
        # the re-timed runs (the yardstick as it stands) in colour, one per contender; earlier
        # single-timing runs in grey behind them
        singles = [(tasks.index(t), x) for r in group if not r["retimed"] for t, x in r["ratios"].items()]
        if singles:
            ax.scatter(*zip(*singles), color="0.75", marker="x", s=16, label="single timings (all contenders)")
        retimed = sorted({r["variant"] for r in group if r["retimed"]})
        for k, v in enumerate(retimed):
            offset = (k - 0.5 * (len(retimed) - 1)) * 0.15
            pts = [(tasks.index(t) + offset, x) for r in group if r["retimed"] and r["variant"] == v
                   for t, x in r["ratios"].items()]
            ax.scatter(*zip(*pts), color=colors[v], marker="o", s=24, label=f"{v}, re-timed")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set_xticks(range(len(tasks)), tasks, rotation=45, fontsize=8)
        ax.set_title(f"{target.upper()} {kind}s", fontsize=10)
        ax.set_ylabel("best@16 / MetaSchedule best@64")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=1, frameon=False)
    fig.suptitle("#15: best at 16 candidates / MetaSchedule's best at 64 in the same run, every run "
                 "(under the dashed line: faster)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", default="reports")
    ap.add_argument("--out", default="reports/tune_results")
    args = ap.parse_args()
    rows = runs(Path(args.reports))
    write_history(rows, args.out, table, plot, f"no tuning benchmark runs in {args.reports}/bench_tune_*.json")


if __name__ == "__main__":
    main()
