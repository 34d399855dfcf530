"""Benchmark: how many of MetaSchedule's candidates the evaluation must re-time to find the best.

The evaluation re-times MetaSchedule's candidates with its own checker (correctness first, one
timer for every contender). Re-timing all 64 of a task cost as much GPU time as tuning it. This
reads an evaluation archive whose tasks were re-timed in full and asks, for each N: had only
MetaSchedule's N fastest by its own measurement (plus its first K, which MS@K needs) been
re-timed, how far would the checker's best be from its best over all candidates?

    python -m pipeline.bench.retime_top [--archive databases/evaluate-gpu] [--out reports/gpu/retime_top.json]
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

from pipeline.stats import geomean

SIZES = (4, 8, 12, 16, 24, 32)


def task_rows(archive: Path) -> list[dict]:
    """Per task re-timed in full: MetaSchedule's own latencies and the checker's outcomes."""
    from pipeline import records

    rows = []
    for cache in sorted((archive / "tasks").glob("*.json")):
        ms = json.loads(cache.read_text()).get("metaschedule")
        tar = archive / "metaschedule" / f"{cache.stem}.tar.xz"
        if not ms or "retime" in ms["key"] or not tar.exists():
            continue
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(tar, "r:xz") as t:
            for member in t.getmembers():
                if member.isfile() and member.name in ("database_workload.json", "database_tuning_record.json"):
                    (Path(tmp) / member.name).write_bytes(t.extractfile(member).read())
            ms_latency = [r.latency_s for r in records.scan(Path(tmp))]
        checker = [o["latency_s"] if o and o.get("stage") == "ok" else None for o in ms["outcomes"]]
        if len(ms_latency) == len(checker) and any(checker):
            rows.append({"task": cache.stem, "ms_latency_s": ms_latency, "checker_latency_s": checker})
    return rows


def compare(rows: list[dict], first: int, sizes=SIZES) -> dict:
    from pipeline.stages.evaluate import retime_selection

    out = {}
    for n in sizes:
        ratios, exact, none = [], 0, 0
        for r in rows:
            best = min(x for x in r["checker_latency_s"] if x)
            chosen = retime_selection(r["ms_latency_s"], first, n)
            got = [x for i, x in enumerate(r["checker_latency_s"]) if x and i in chosen]
            if not got:
                none += 1
                continue
            ratios.append(min(got) / best)
            exact += min(got) == best
        out[str(n)] = {"checks_per_task": round(sum(len(retime_selection(r["ms_latency_s"], first, n)) for r in rows)
                                                / len(rows), 1),
                       "best_found_exactly": exact, "no_correct_candidate_timed": none,
                       "worst_ratio": round(max(ratios), 4) if ratios else None,
                       "geomean_ratio": round(geomean(ratios), 5) if ratios else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archive", default="databases/evaluate-gpu")
    ap.add_argument("--first", type=int, default=4, help="MetaSchedule's first K, always re-timed (evaluate.attempts)")
    ap.add_argument("--out", default="reports/gpu/retime_top.json")
    a = ap.parse_args()
    rows = task_rows(Path(a.archive))
    if not rows:
        raise SystemExit(f"retime_top: no task re-timed in full in {a.archive}")
    result = {"archive": a.archive, "tasks": len(rows), "first": a.first,
              "candidates_per_task": round(sum(len(r["ms_latency_s"]) for r in rows) / len(rows), 1),
              "question": "re-time MetaSchedule's N fastest (its own timing) + its first K: the checker's best "
                          "of those over its best of all (1.0 = found)",
              "by_n": compare(rows, a.first)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    for n, x in result["by_n"].items():
        print(f"N={n:>2}: {x['checks_per_task']:5.1f} checks/task, exact {x['best_found_exactly']}/{len(rows)}, "
              f"worst {x['worst_ratio']}, geomean {x['geomean_ratio']}")


if __name__ == "__main__":
    main()
