"""A ranking cost model for MetaSchedule's search, pre-trained on a target's campaign.

MetaSchedule's XGBModel (pipeline.cost_model) regresses each candidate's normalised throughput
(min_cost / cost inside its workload) as a sum of per-store predictions. What the search needs
of it is an order: which candidates of *this* workload to measure. This model learns that order
directly: XGBoost's pairwise ranking objective with each workload a query group, on the
per-store features aggregated per candidate (sum, mean and max over its stores, and their
count). On the CPU campaign, held out by workload (pipeline.bench.cost_model --model rank), it
ranks better than the pack-sum regression on the same data and folds.

The data is a CostModel's (`groups`: workload -> features, costs), so the campaign's feature
cache serves both. `as_metaschedule(focus)` gives MetaSchedule a cost model object
(`tune_tir(..., cost_model=...)`) that goes on learning from the run's measurements, each
tuned workload's group weighted `focus` times in the ranking loss.
"""

from __future__ import annotations

import os

import numpy as np

from pipeline.cost_model import FAILED_COST
from pipeline.tvm_env import ms
from tvm.ir.utils import derived_object

GRADES = 16          # relevance levels of the ranking labels: 1..16 by normalised throughput, 0 failed
XGB_PARAMS = {"objective": "rank:pairwise", "n_estimators": 300, "max_depth": 8, "learning_rate": 0.1,
              "subsample": 0.8, "colsample_bytree": 0.8, "n_jobs": os.cpu_count() or 1, "random_state": 0}


def aggregate(feats: list[np.ndarray]) -> np.ndarray:
    """One row per candidate: the sum, mean and max of its per-store features, and their count."""
    return np.array([np.concatenate([x.sum(0), x.mean(0), x.max(0), [len(x)]]) for x in feats], dtype="float32")


def grades(costs) -> np.ndarray:
    """Ranking labels inside one workload: 0 for a failed candidate, else 1 + floor(15 x min/cost)."""
    c = np.asarray(costs, dtype="float64")
    out = np.zeros(len(c), dtype="float32")
    ok = c < FAILED_COST
    if ok.any():
        out[ok] = 1 + np.floor(c[ok].min() / c[ok] * (GRADES - 1))
    return out


class RankModel:
    """Scores candidates; higher is predicted faster. Only the order within a workload means anything."""

    def __init__(self, groups: dict[str, tuple[list[np.ndarray], list[float]]]):
        self.groups = {k: (list(f), list(c)) for k, (f, c) in groups.items() if f}
        self.weights: dict[str, float] = {}
        self.ranker = None

    def train(self) -> None:
        import xgboost

        keys = list(self.groups)
        if not keys:
            self.ranker = None
            return
        x = np.concatenate([aggregate(self.groups[k][0]) for k in keys])
        y = np.concatenate([grades(self.groups[k][1]) for k in keys])
        qid = np.concatenate([np.full(len(self.groups[k][0]), i) for i, k in enumerate(keys)])
        w = np.array([self.weights.get(k, 1.0) for k in keys], dtype="float32")
        self.ranker = xgboost.XGBRanker(**XGB_PARAMS).fit(x, y, qid=qid, sample_weight=w)

    def predict(self, feats: list[np.ndarray]) -> np.ndarray:
        """Raw ranking scores (any sign); a candidate without features scores lowest."""
        out = np.full(len(feats), -1e9)
        ok = [i for i, f in enumerate(feats) if len(f)]
        if ok and self.ranker is not None:
            out[ok] = self.ranker.predict(aggregate([feats[i] for i in ok]))
        elif ok:
            out[ok] = 0.0
        return out

    def add(self, key: str, feats: list[np.ndarray], costs: list[float], weight: float = 1.0) -> None:
        kept = [(x, cost) for x, cost in zip(feats, costs) if len(x)]
        if kept:
            f, c = self.groups.setdefault(key, ([], []))
            f.extend(x for x, _ in kept)
            c.extend(cost for _, cost in kept)
        self.weights[key] = weight

    def as_metaschedule(self, focus: int = 1):
        """This model as MetaSchedule's cost model object (a fresh one, trained), learning from
        the run: each round's measurements join their workload's group, weighted `focus`."""
        if focus < 1:
            raise ValueError(f"focus must be >= 1 (got {focus})")
        inner = RankModel(self.groups)
        inner.train()
        return MetaScheduleRank(inner, focus)


def for_search(cost, focus: int = 1, ranker: bool = False):
    """MetaSchedule's cost model object for a search on `cost`'s data (a pipeline.cost_model.CostModel,
    trained or not: either model trains its own): its XGBModel (`CostModel.as_metaschedule`), or
    with `ranker` this module's ranking model."""
    return RankModel(cost.groups).as_metaschedule(focus) if ranker else cost.as_metaschedule(focus)


@derived_object
class MetaScheduleRank(ms.cost_model.PyCostModel):
    """RankModel behind MetaSchedule's PyCostModel interface. The evolutionary search samples
    parents in proportion to the scores and keeps the best across generations, so scores must be
    non-negative and comparable across calls: the ranking score through a logistic function."""

    def __init__(self, model: RankModel, focus: int = 1):
        super().__init__()
        self.model = model
        self.focus = focus
        self.extractor = ms.feature_extractor.PerStoreFeature()

    def load(self, path: str) -> None:
        self.model.ranker.load_model(path)

    def save(self, path: str) -> None:
        self.model.ranker.save_model(path)

    def update(self, context, candidates, results) -> None:
        if not candidates:
            return
        feats = [x.numpy().astype("float32") for x in self.extractor.extract_from(context, candidates)]
        costs = [float(np.median([float(s) for s in r.run_secs])) if r.run_secs else FAILED_COST for r in results]
        self.model.add(ms.utils.shash2hex(context.mod), feats, costs, float(self.focus))
        self.model.train()

    def predict(self, context, candidates) -> np.ndarray:
        if not candidates:
            return np.zeros(0)
        feats = [x.numpy().astype("float32") for x in self.extractor.extract_from(context, candidates)]
        return 1.0 / (1.0 + np.exp(-np.clip(self.model.predict(feats), -30, 30)))
