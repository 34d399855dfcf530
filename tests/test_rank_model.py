"""The ranking cost model (pipeline.rank_model): its labels, that it learns an order within a
workload from real per-store features and ranks a held-out workload by it, and that
MetaSchedule's search takes it as its cost model and feeds it the run's measurements."""

import numpy as np
import pytest

from helpers import SPEC, tiny_search_params
from pipeline import codec
from pipeline.cost_model import FAILED_COST, CostModel
from pipeline.rank_model import RankModel, aggregate, grades
from pipeline.space import context, sample_many
from pipeline.tvm_env import ms
from pipeline.workloads import Spec, build


def _synthetic_latency(x: np.ndarray) -> float:
    """A latency the features determine: more float ops in the innermost stores, slower."""
    return 1e-5 * (1.0 + float(np.abs(x).sum()) / 1e3)


def _group(target, spec, n, seed):
    mod = build(spec)
    scripts = list(dict.fromkeys(codec.canonical_script(s.trace) for s in sample_many(mod, target, n, seed=seed)))
    feats = [x for x in CostModel(target).features(mod, scripts) if x is not None]
    return mod, feats, [_synthetic_latency(x) for x in feats]


def test_labels_grade_a_workload_by_its_own_best_and_failures_last():
    assert grades([1e-5, 2e-5, FAILED_COST, 4e-5]).tolist() == [16, 8, 0, 4]
    assert grades([FAILED_COST]).tolist() == [0]
    x = [np.ones((3, 4), dtype="float32"), np.arange(8, dtype="float32").reshape(2, 4)]
    a = aggregate(x)
    assert a.shape == (2, 13) and a[0, -1] == 3 and a[1, -1] == 2
    assert a[1, :4].tolist() == [4, 6, 8, 10] and a[1, 8:12].tolist() == [4, 5, 6, 7]     # sum, max


def test_it_ranks_a_held_out_workload_by_what_it_learned_on_others(cpu_target):
    from scipy.stats import spearmanr

    groups = {}
    for i, spec in enumerate([SPEC, Spec("matmul", (8, 32, 48), "float32"), Spec("matmul", (16, 16, 24), "float32")]):
        _, feats, lat = _group(cpu_target, spec, 40, seed=i)
        groups[f"w{i}"] = (feats, lat)
    held_feats, held_lat = groups.pop("w2")
    model = RankModel(groups)
    assert model.ranker is None and (model.predict(held_feats) == 0).all()     # untrained: no order
    model.train()
    pred = model.predict(held_feats + [np.zeros((0, 164), dtype="float32")])
    assert pred[-1] == -1e9                                   # no features: ranked last
    assert spearmanr(pred[:-1], [-t for t in held_lat]).correlation > 0.5


@pytest.mark.slow
def test_metaschedule_tunes_with_it_and_feeds_it_the_runs_measurements(tmp_path, cpu_target):
    from pipeline import metaschedule

    mod, feats, lat = _group(cpu_target, SPEC, 20, seed=0)
    pre = RankModel({"campaign": (feats, lat)})
    ms_model = pre.as_metaschedule(focus=4)
    assert ms_model.model is not pre and ms_model.model.ranker is not None
    # scores for the search: non-negative, in the model's order
    probe = sample_many(mod, cpu_target, 4, seed=7)
    cands = [ms.MeasureCandidate(s, ms.arg_info.ArgInfo.from_prim_func(s.mod["main"])) for s in probe]
    scores = ms_model.predict(context(cpu_target, mod), cands)
    raw = ms_model.model.predict([f.numpy().astype("float32") for f in
                                  ms.feature_extractor.PerStoreFeature().extract_from(context(cpu_target, mod), cands)])
    assert len(scores) == 4 and (scores > 0).all() and (np.argsort(scores) == np.argsort(raw)).all()
    sp = tiny_search_params()
    evolve = ms.search_strategy.EvolutionarySearch(population_size=16, genetic_num_iters=1)
    tuned = metaschedule.tune(build(Spec("matmul", (16, 16, 24), "float32")), cpu_target, 4, tmp_path / "ms", sp,
                              "ranked", strategy=evolve, cost_model=ms_model)
    assert tuned.trials == 4
    run = [k for k in ms_model.model.groups if k != "campaign"]
    assert len(run) == 1 and len(ms_model.model.groups[run[0]][0]) == 4 and ms_model.model.weights[run[0]] == 4.0
    assert len(pre.groups["campaign"][0]) == len(feats) and len(pre.groups) == 1     # the pre-trained one untouched


def test_bench_ms_rank_gives_metaschedule_the_ranking_model_on_the_cost_models_data(monkeypatch, cpu_target):
    from types import SimpleNamespace

    from pipeline import metaschedule
    from pipeline.bench import tune as bench

    _, feats, lat = _group(cpu_target, SPEC, 12, seed=0)
    cost = CostModel(cpu_target)
    cost.groups = {"w": (feats, lat)}
    given = []
    monkeypatch.setattr(metaschedule, "tune", lambda *a, **kw: given.append(kw["cost_model"]) or "tuned")
    monkeypatch.setattr(bench, "_retimed", lambda tuned, *a: {"_candidates": []})
    sp = SimpleNamespace(population_size=512, genetic_num_iters=4)
    trained = []                              # both read the data and train their own: no copy trained

    def make(train=True):
        trained.append(train)
        return cost

    bench._inside(None, None, None, 16, sp, None, None, "x", None, make, 16, ranker=True)
    bench._inside(None, None, None, 16, sp, None, None, "x", None, make, 16)
    assert trained == [False, False]
    ranked, xgb = given
    assert ranked.focus == 16 and ranked.model.ranker is not None and len(ranked.model.groups["w"][0]) == len(feats)
    assert not hasattr(xgb, "focus") and xgb.data_size == len(feats)      # ms_cost: the XGBModel as before
