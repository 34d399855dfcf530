"""Benchmark: does the cost model rank candidates of workloads it never saw?

    python -m pipeline.bench.cost_model --search-dir data/search-gpu --target nvidia/nvidia-h100 \
        [--folds 5] [--model xgb|rank] [--out reports/bench_cost_model_cuda.json]

The measured candidates of a search campaign, split by workload into folds: for each fold the
cost model (pipeline.cost_model) is trained on the other folds' workloads and ranks every
candidate of the fold's workloads. Per held-out workload: the Spearman correlation between
predicted and measured throughput over its correct candidates, and the best latency among the
k best-predicted candidates against the workload's best (k = 1, 4, 8), beside the expected
value for k candidates drawn at random (a pick of failed candidates only reaches 0). That is
the choice `tune --oversample` makes. `--model rank`: the ranking model (pipeline.rank_model) on the
same data and folds instead of MetaSchedule's XGBModel.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np


def _reached(costs: np.ndarray, picked: np.ndarray) -> float:
    """Best latency of the workload / best latency among the picked (0: every pick failed)."""
    from pipeline.cost_model import FAILED_COST

    return 0.0 if picked.min() >= FAILED_COST else float(costs.min() / picked.min())


def _expected_random_best(costs: np.ndarray, k: int, draws: int = 200, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    return float(np.mean([_reached(costs, rng.choice(costs, k, replace=False)) for _ in range(draws)]))


def evaluate(groups: dict, target, folds: int, seed: int = 0, kind: str = "xgb") -> list[dict]:
    from scipy.stats import spearmanr

    from pipeline.cost_model import FAILED_COST, CostModel
    from pipeline.rank_model import RankModel

    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    rows = []
    for f in range(folds):
        held = keys[f::folds]
        train = {k: v for k, v in groups.items() if k not in set(held)}
        if kind == "rank":
            model = RankModel(train)
            predict = model.predict
        else:
            model = CostModel(target)
            model.groups = train
            predict = model.xgb._predict
        model.train()
        for h in held:
            feats, costs = groups[h]
            c = np.array(costs)
            ok = c < FAILED_COST
            if ok.sum() < 8:
                continue
            pred = predict(feats)
            order = np.argsort(-pred)
            row = {"workload": h, "candidates": len(c), "correct": int(ok.sum()),
                   "spearman": float(spearmanr(pred[ok], -c[ok]).correlation)}
            for k in (1, 4, 8):
                row[f"top{k}"] = _reached(c, c[order[:k]])
                row[f"random{k}"] = _expected_random_best(c, k)
            rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Means and medians over workloads. A pick of only failed candidates reaches 0 of the best
    (a failed measurement is a wasted one), so arithmetic means, not geometric ones."""
    import statistics

    rho = [r["spearman"] for r in rows if r["spearman"] == r["spearman"]]     # NaN: constant prediction
    out = {"workloads": len(rows), "spearman_mean": sum(rho) / len(rho), "spearman_positive": sum(x > 0 for x in rho),
           "constant_predictions": len(rows) - len(rho)}
    for k in (1, 4, 8):
        for kind in ("top", "random"):
            xs = [r[f"{kind}{k}"] for r in rows]
            out[f"best_of_{kind}{k}_mean"] = sum(xs) / len(xs)
            out[f"best_of_{kind}{k}_median"] = statistics.median(xs)
        out[f"top{k}_all_failed"] = sum(r[f"top{k}"] == 0 for r in rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--search-dir", required=True)
    ap.add_argument("--target", required=True, help="the campaign's target (JSON or a tag)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--model", choices=["xgb", "rank"], default="xgb",
                    help="xgb: MetaSchedule's XGBModel (pack-sum regression); rank: pipeline.rank_model")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from pipeline import cost_model, files
    from pipeline.stages.data import DataParams

    start = time.perf_counter()
    target = args.target if not args.target.lstrip().startswith("{") else __import__("json").loads(args.target)
    exclude = cost_model.training_split_exclusions(DataParams(search_dir=args.search_dir))
    model = cost_model.pretrained(target, args.search_dir, exclude, cache_dir="data/cost-model", progress=True)
    rows = evaluate(model.groups, model.target, args.folds, kind=args.model)
    summary = summarize(rows)
    files.write_json(args.out, {"search_dir": args.search_dir, "target": str(model.target.kind.name),
                                "folds": args.folds, "model": args.model, "records": model.size, "excluded_workloads": len(exclude),
                                "seconds": round(time.perf_counter() - start, 1), **summary, "per_workload": rows})
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}, "->", args.out)


if __name__ == "__main__":
    main()
