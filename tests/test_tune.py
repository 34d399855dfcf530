"""`little-dragon tune`: model-guided tuning into a MetaSchedule database, resumable."""

import json
from types import SimpleNamespace

import pytest

from helpers import tiny_model
from pipeline.cli import main

KERNEL_TE = """
from tvm import te
A = te.placeholder((16, 64), name="A")
B = te.placeholder((64, 64), name="B")
k = te.reduce_axis((0, 64), name="k")
C = te.compute((16, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul")
"""


@pytest.mark.slow   # 60-120 s on 2 cores: in `make test`'s second phase, so the first stays under 15 min
def test_tune_measures_n_candidates_into_a_database_tvm_reads_and_resumes(tmp_path, capsys, cpu_target):
    from pipeline import files
    from pipeline.optimize import load_kernel
    from pipeline.tvm_env import ms

    tiny_model(tmp_path / "model", cpu_target, steps=60)
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL_TE)
    work = tmp_path / "tuned"
    args = ["tune", str(kernel), "--model", str(tmp_path / "model"), "--trials", "6", "--batch", "4",
            "--work-dir", str(work), "--quiet"]
    assert main(args) == 0
    rows = list(files.read_jsonl(work / "tune.jsonl"))
    assert len(rows) == 6 and len({r["script"] for r in rows}) == 6
    assert {r["round"] for r in rows} >= {1, 2}                    # refinement rounds followed
    result = json.loads((work / "result.json").read_text())
    assert result["measured"] == 6 and result["best_latency_s"] == min(r["latency_s"] for r in rows if r["latency_s"])
    assert result["curve"] == sorted(result["curve"], reverse=True)   # best so far never gets worse
    # TVM's own database API reads the result and finds the best schedule
    mod = load_kernel(kernel)
    db = ms.database.JSONDatabase(work_dir=str(work))
    assert len(db.get_all_tuning_records()) == sum(1 for r in rows)
    assert db.query_schedule(mod, cpu_target, "main") is not None
    # resume: asking for more measures only the difference
    assert main(args[:5] + ["8"] + args[6:]) == 0
    assert len(list(files.read_jsonl(work / "tune.jsonl"))) == 8
    assert len(ms.database.JSONDatabase(work_dir=str(work)).get_all_tuning_records()) == 8
    assert "MetaSchedule database" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (["--trials", "0"], "--trials must be >= 1"),
    (["--target", "no-such-target"], "no-such-target"),
    (["--oversample", "0"], "--oversample must be >= 1"),
    (["--oversample", "4", "--cost-data", "no-such-folder"], "not a search work folder"),
    (["--focus", "4"], "--focus is for --strategy ms-cost"),
    # ms-cost (no --model given): what belongs to the model's strategy, and bad numbers
    (["--strategy", "ms-cost", "--oversample", "4"], "for --strategy model"),
    (["--strategy", "ms-cost", "--no-fill"], "for --strategy model"),
    (["--strategy", "ms-cost", "--focus", "0"], "must be >= 1"),
    (["--strategy", "ms-cost", "--trials", "0"], "--trials must be >= 1"),
    (["--strategy", "ms-cost", "--target", "no-such-target"], "no-such-target"),
    (["--strategy", "ms-rank", "--oversample", "4"], "for --strategy model (ms-rank"),
    (["--strategy", "ms-rank", "--focus", "0"], "must be >= 1"),
])
def test_tune_rejects_bad_input_with_one_line(tmp_path, capsys, extra, message):
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL_TE)
    (tmp_path / "m").mkdir()
    model = [] if "--strategy" in extra else ["--model", str(tmp_path / "m")]
    assert main(["tune", str(kernel), *model, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_tune_rejects_a_file_without_a_kernel(tmp_path, capsys):
    kernel = tmp_path / "k.py"
    kernel.write_text("x = 1\n")
    (tmp_path / "m").mkdir()
    assert main(["tune", str(kernel), "--model", str(tmp_path / "m")]) == 2
    assert "no PrimFunc" in capsys.readouterr().err


# slow phase (38-65 s on CI's 2 cores): the default run stays under 15 min
@pytest.mark.slow
def test_a_model_that_repeats_itself_gets_its_rounds_filled_from_the_design_space(tmp_path, monkeypatch, cpu_target):
    """The budget is spent either way: a round with too few new scripts from the model is
    filled with design-space samples, each candidate keeping its source; without `fill` the
    tune stops early, as before."""
    from pipeline import codec, files
    from pipeline.optimize import load_kernel
    from pipeline.space import sample_many
    from pipeline.tune import Tuner

    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL_TE)
    mod = load_kernel(kernel)
    only = codec.canonical_script(sample_many(mod, cpu_target, 1, seed=3)[0].trace)
    monkeypatch.setattr(Tuner, "write", lambda self, round_: ([only], 0.0))    # the same script every round
    r = Tuner(mod, {"kind": "llvm", "num-cores": 2}, None, None, tmp_path / "filled", batch=4).run(6, progress=False)
    rows = list(files.read_jsonl(tmp_path / "filled" / "tune.jsonl"))
    assert r.measured == 6 and len({x["script"] for x in rows}) == 6
    assert [x["source"] for x in rows].count("model") == 1 and r.sampled == 5
    bare = Tuner(mod, {"kind": "llvm", "num-cores": 2}, None, None, tmp_path / "bare", batch=4, fill=False)
    r = bare.run(6, max_idle_rounds=2, progress=False)
    assert r.measured == 1 and r.sampled == 0 and r.stopped.startswith("no new script")


def test_bench_summary_counts_each_variant_only_where_it_ran_and_misses_stay_out_of_its_geomean():
    from pipeline.bench.tune import summarize

    def run(*curve):
        return {"curve": list(curve), "seconds": 1.0}

    rows = [  # task a: the model beats MetaSchedule@4 at 2 trials; ms_cost finds nothing correct
        {"task": "a", "metaschedule": run(8.0, 6.0, 5.0, 4.0), "model": run(5.0, 2.0), "ms_cost": run(None, None)},
        # task b: the model is 2x slower than MetaSchedule@4 and never reaches it; ms_cost left out
        {"task": "b", "metaschedule": run(2.0, 2.0, 1.0, 1.0), "model": run(3.0, 2.0)},
    ]
    s = summarize(rows, trials=2, ms_trials=4)
    assert s["model@2_le_ms@4"] == 1 and s["model_tasks"] == 2 and s["fraction"] == 0.5
    assert s["model_geomean_ratio_to_ms@4"] == pytest.approx((0.5 * 2.0) ** 0.5)
    assert s["ms_cost@2_le_ms@4"] == 0 and s["ms_cost_tasks"] == 1 and s["ms_cost_geomean_ratio_to_ms@4"] is None
    assert s["ms@2_geomean_ratio_to_ms@4"] == pytest.approx((1.5 * 2.0) ** 0.5)
    a, b = s["per_task"]
    assert a["model_le_ms_full"] and a["model_trials_to_ms_full"] == 2 and not a["ms_cost_le_ms_full"]
    assert not b["model_le_ms_full"] and b["model_trials_to_ms_full"] is None and "ms_cost@2" not in b


def test_bench_summary_of_several_runs_counts_tasks_once_and_the_fraction_over_the_runs_with_the_model():
    from pipeline.bench.tune import summarize

    ms = {"curve": [2.0, 1.0], "seconds": 1.0}
    rows = [{"task": "a", "session": 1, "metaschedule": ms, "model": {"curve": [1.0], "seconds": 1.0}},
            {"task": "a", "session": 2, "metaschedule": ms, "ms_cost": {"curve": [3.0], "seconds": 1.0}}]
    s = summarize(rows, trials=1, ms_trials=2)
    assert s["tasks"] == 1 and s["runs"] == 2 and s["model_tasks"] == 1 and s["fraction"] == 1.0


@pytest.mark.parametrize("value", ["2048", "2048x0", "axb", "1x2x3"])
def test_bench_refuses_a_bad_inside_search_with_one_line(value, monkeypatch, capsys):
    import sys

    from pipeline.bench import tune as bench

    monkeypatch.setattr(sys, "argv", ["bench", "--variants", "ms_cost", "--inside-search", value])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2 and "--inside-search takes POPxGENS" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_bench_refuses_an_eps_greedy_outside_0_1_with_one_line(value, monkeypatch, capsys):
    import sys

    from pipeline.bench import tune as bench

    monkeypatch.setattr(sys, "argv", ["bench", "--variants", "ms_cost_eps", "--eps-greedy", value])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2 and "--eps-greedy must be within [0, 1]" in capsys.readouterr().err


def test_bench_ms_cost_eps_hands_its_share_of_random_picks_to_metaschedules_search(monkeypatch, cpu_target):
    """ms_cost and ms_cost_eps run the same search but for eps_greedy: MetaSchedule's own 0.05 for
    ms_cost (no argument), the given share for ms_cost_eps."""
    from pipeline import metaschedule
    from pipeline.bench import tune as bench
    from pipeline.tvm_env import ms

    made, tuned = [], []

    def strategy(**kw):
        made.append(kw)
        return "strategy"

    monkeypatch.setattr(ms.search_strategy, "EvolutionarySearch", strategy)
    monkeypatch.setattr(metaschedule, "tune", lambda *a, **kw: tuned.append(kw["strategy"]) or "tuned")
    monkeypatch.setattr(bench, "_retimed", lambda tuned, *a: {"_candidates": []})
    for eps in (None, 0.25):
        bench._inside(None, None, None, 16, SimpleNamespace(population_size=512, genetic_num_iters=4), None,
                      None, "x", None, None, eps_greedy=eps)
    assert made == [{"population_size": 512, "genetic_num_iters": 4},
                    {"population_size": 512, "genetic_num_iters": 4, "eps_greedy": 0.25}]
    assert tuned == ["strategy", "strategy"]


def test_bench_finalists_are_each_contenders_best_then_timed_again_taking_turns_and_compared_by_median():
    import contextlib
    from types import SimpleNamespace

    from pipeline.bench.tune import best_of_first, final_retime, summarize

    # the fastest correct of the first k as timed; a script that did not encode (None) is never one
    cands = [("a", 5.0), (None, None), ("b", 3.0), ("c", None), ("d", 1.0)]
    assert best_of_first(cands, 2) == "a" and best_of_first(cands, 4) == "b" and best_of_first(cands, 5) == "d"
    assert best_of_first([("x", None)], 1) is None

    class Checker:      # each script's timings in turn; "bad" fails its check
        def __init__(self):
            self.asked = []
            self.timings = {"fast": iter([1.0, 9.0, 1.2]), "slow": iter([2.0, 2.1, 2.2])}
            self.quiet = False

        @contextlib.contextmanager
        def alone_on_cpu(self, target_spec):
            self.quiet = target_spec == "llvm"
            yield self.quiet
            self.quiet = False

        def check_many(self, mod, texts, target_spec, timed):
            self.asked.append((list(texts), self.quiet))
            return [SimpleNamespace(correct=t != "bad", latency_s=next(self.timings[t]) if t != "bad" else None)
                    for t in texts]

    checker = Checker()
    out = final_retime(None, "llvm", checker, {"metaschedule@4": "fast", "metaschedule@2": "slow",
                                               "ms_cost": "fast", "transfer_first_cost": "bad", "model": None}, 3)
    # one copy of a shared script, in turns; on a CPU, no build beside a timing
    assert checker.asked == [(["bad", "fast", "slow"] * 3, True)] and not out["builds_beside_timings"]
    assert out["latency_s"] == {"metaschedule@4": 1.2, "metaschedule@2": 2.1, "ms_cost": 1.2,
                                "transfer_first_cost": None, "model": None}
    assert out["spread_s"]["metaschedule@4"] == [1.0, 9.0]

    # the summary compares the medians with MetaSchedule@ms_trials's; a finalist without one is a miss
    run = {"curve": [3.0, 2.0, 1.0, 1.0], "seconds": 1.0}
    rows = [{"task": "t", "metaschedule": run, "ms_cost": {"curve": [1.0, 1.0], "seconds": 1.0}, "final": out},
            {"task": "u", "metaschedule": run, "ms_cost": {"curve": [1.0, 1.0], "seconds": 1.0},
             "final": {"latency_s": {"metaschedule@4": 2.0, "metaschedule@2": 2.0, "ms_cost": 4.0}}}]
    s = summarize(rows, trials=2, ms_trials=4)
    assert s["ms_cost@2_le_ms@4"] == 2                                # single timings: both win
    assert s["final_ms_cost@2_le_ms@4"] == 1 and s["final_ms_cost_tasks"] == 2   # timed again: only t
    assert s["final_ms_cost_geomean_ratio_to_ms@4"] == pytest.approx((1.0 * 2.0) ** 0.5)
    assert s["final_ms@2_le_ms@4"] == 1 and s["final_transfer_first_cost@2_le_ms@4"] == 0
    assert s["final_transfer_first_cost_geomean_ratio_to_ms@4"] is None
    assert s["per_task"][0]["final_ratio_ms_to_ms_full"] == pytest.approx(2.1 / 1.2)


@pytest.mark.parametrize("tasks", [1, 5])
def test_bench_plot_legend_sits_below_the_panels_inside_the_figure(tmp_path, tasks):
    from pipeline.bench.tune import plot

    curve = [3e-4, 2e-4, None, 1e-4]
    rows = [{"task": f"T{i}", "metaschedule": {"curve": curve}, "ms_cost": {"curve": curve},
             "final": {"latency_s": {"metaschedule@4": 1e-4, "ms_cost": 1.1e-4}}} for i in range(tasks)]
    fig = plot(rows, str(tmp_path / "p.png"))
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert (tmp_path / "p.png").stat().st_size > 0 and len(fig.legends[0].get_texts()) == 3
    assert legend.x0 >= 0 and legend.y0 >= 0 and legend.x1 <= fig.bbox.width
    for ax in fig.axes:
        if ax.axison:    # the panel with its tick labels and x label stays above the legend
            assert ax.get_tightbbox(renderer).y0 >= legend.y1


@pytest.mark.slow   # ~1-2 min on 2 cores each (MetaSchedule's search, population 512 x 4)
@pytest.mark.parametrize("strategy", ["ms-cost", "ms-rank"])
def test_ms_cost_strategy_tunes_with_the_pretrained_cost_model_checks_the_best_and_resumes(tmp_path, capsys,
                                                                                         cpu_target, strategy):
    from test_cost_model import _database

    from pipeline import files
    from pipeline.optimize import load_kernel
    from pipeline.tune_search import SOURCE
    from pipeline.tvm_env import ms
    from pipeline.workloads import Spec

    _database(tmp_path / "search", cpu_target, [Spec("matmul", (8, 32, 48), "float32")], 10)
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL_TE)
    work = tmp_path / "tuned"
    args = ["tune", str(kernel), "--strategy", strategy, "--cost-data", str(tmp_path / "search"), "--trials", "6",
            "--batch", "4", "--work-dir", str(work), "--quiet"]
    assert main(args) == 0
    rows = list(files.read_jsonl(work / "tune.jsonl"))
    assert len(rows) == 6 and {r["source"] for r in rows} == {SOURCE} and [r["round"] for r in rows] == [1] * 4 + [2] * 2
    result = json.loads((work / "result.json").read_text())
    assert result["strategy"] == strategy and result["measured"] == 6 and str(tmp_path / "search") in result["cost_data"]
    # the best is the fastest of those the checker passed, among MetaSchedule's fastest
    passed = [c for c in result["checked"] if c["correct"]]
    assert passed and result["best_latency_s"] == min(c["latency_s"] for c in passed)
    assert (work / "best.script").read_text().strip() in {r["script"] for r in rows}
    mod = load_kernel(kernel)
    assert len(ms.database.JSONDatabase(work_dir=str(work)).get_all_tuning_records()) == 6
    assert ms.database.JSONDatabase(work_dir=str(work)).query_schedule(mod, cpu_target, "main") is not None
    # resume: asking for more measures only the difference, and the first six stay as they were
    assert main(args[:7] + ["8"] + args[8:]) == 0
    again = list(files.read_jsonl(work / "tune.jsonl"))
    assert len(again) == 8 and again[:6] == rows
    assert len(ms.database.JSONDatabase(work_dir=str(work)).get_all_tuning_records()) == 8
    assert f"tune ({strategy})" in capsys.readouterr().out


def test_ms_rank_hands_metaschedule_the_ranking_model_on_the_cost_models_data(tmp_path, monkeypatch, cpu_target):
    """--strategy ms-rank: the same search as ms-cost, its cost model object the ranking model
    trained on the CostModel's groups, learning with the same focus."""
    from helpers import SPEC
    from test_rank_model import _group

    from pipeline import tuning, tune_search
    from pipeline.cost_model import CostModel
    from pipeline.rank_model import MetaScheduleRank
    from pipeline.tvm_env import ms

    mod, feats, lat = _group(cpu_target, SPEC, 12, seed=0)
    cost = CostModel(cpu_target)
    cost.groups = {"w": (feats, lat)}
    given = []
    monkeypatch.setattr(tuning, "tune", lambda *a, **kw: given.append(kw["cost_model"]))
    sp = tune_search.search_params("params.yaml", 4)
    for ranker in (True, False):
        r = tune_search.tune_kernel(mod, {"kind": "llvm", "num-cores": 2}, 4, tmp_path / str(ranker), cost, "here",
                                    sp, 8, verify_top=0, progress=False, ranker=ranker)
        assert json.loads((tmp_path / str(ranker) / "result.json").read_text())["strategy"] == \
            tune_search.strategy_name(ranker)
        assert r.stopped == "no candidate ran"     # nothing was measured: tuning.tune did not run
    ranked, xgb = given
    assert isinstance(ranked, MetaScheduleRank) and ranked.focus == 8 and ranked.model.ranker is not None
    assert isinstance(xgb, ms.cost_model.XGBModel) and xgb.data_size == len(feats)


def test_skip_measured_gets_past_what_was_measured_before_and_sends_exactly_its_budget(monkeypatch):
    """A resumed tune's search proposes kernels measured in the earlier run (it does not read them
    from the database): those rounds are skipped, as many as it takes, and no more than
    max_trials candidates go out in all, though the inner search's own count drifts after a
    skipped round (the ranking model's resume measured 3 for 2 asked before this)."""
    from types import SimpleNamespace as NS

    from pipeline import tune_search

    monkeypatch.setattr(tune_search, "structural_hash", lambda mod: mod)
    rounds = iter([["a", "b"], ["c"], ["a", "d"], ["e", "f"], ["g", "h"]])     # what the inner search picks

    class Inner:
        def generate_measure_candidates(self):
            return [NS(sch=NS(mod=m)) for m in next(rounds)]

        def notify_runner_results(self, *a):
            pass

        def pre_tuning(self, *a):
            pass

    skip = tune_search.SkipMeasured(8, 1, {"a", "b", "c"}, tries=1)._inst     # the Python object, not TVM's wrapper
    skip.inner = Inner()
    skip.pre_tuning(2, 2, [])
    sent = [skip.generate_measure_candidates() for _ in range(3)]
    assert [[c.sch.mod for c in r] if r else r for r in sent] == [["d"], ["e"], None]


def test_ms_cost_strategy_refuses_a_work_folder_of_the_model_strategy(tmp_path, capsys):
    from pipeline import files

    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL_TE)
    files.append_jsonl(tmp_path / "tuned" / "tune.jsonl", {"script": "x", "source": "model", "latency_s": None})
    assert main(["tune", str(kernel), "--strategy", "ms-cost", "--work-dir", str(tmp_path / "tuned")]) == 2
    assert "another strategy (model)" in capsys.readouterr().err
