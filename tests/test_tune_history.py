import json

import pytest

from pipeline.bench import tune_history


def _kernels(path, ratios, final=None, **settings):
    rows = [{"task": t, "ms@16": 2.0, "ms@64": 1.0, "ratio_ms_cost_to_ms_full": r} for t, r in ratios.items()]
    for row in rows:
        if final:
            row["final_ratio_ms_cost_to_ms_full"] = final[row["task"]]
            row["final_ratio_ms_to_ms_full"] = 1.0
    path.write_text(json.dumps({"target": {"kind": "llvm"}, "per_task": rows, **settings}))


def test_runs_use_the_retimed_medians_and_tally_each_setting_apart(tmp_path):
    # run 1 single timings, runs 2-3 re-timed with other settings: 1.2 single, 0.9 re-timed -> 0.9 counts
    _kernels(tmp_path / "bench_tune_a.json", {"GMM:0": 0.8, "T2D:0": 1.5})
    _kernels(tmp_path / "bench_tune_b.json", {"GMM:0": 1.2, "T2D:0": 1.1}, final={"GMM:0": 0.9, "T2D:0": 1.3},
             inside_per_iter=8, focus=16)
    _kernels(tmp_path / "bench_tune_c.json", {"GMM:0": 1.0, "T2D:0": 1.0}, final={"GMM:0": 1.0, "T2D:0": 0.95},
             inside_per_iter=8, focus=16)
    (tmp_path / "bench_tune_model_x.json").write_text(json.dumps({"target": {"kind": "llvm"}, "networks": [
        {"network": "mlp", "ms_cost_over_ms": 1.1, "final_ms_cost_over_ms": 0.97}]}))
    rows = tune_history.runs(tmp_path)
    retimed = [r for r in rows if r["variant"] == "ms_cost (rounds of 8, focus 16)"]
    assert [r["ratios"] for r in retimed] == [{"GMM:0": 0.9, "T2D:0": 1.3}, {"GMM:0": 1.0, "T2D:0": 0.95}]
    assert all(r["retimed"] for r in retimed)
    own = [r for r in rows if r["variant"] == "MetaSchedule's own first 16"]
    assert [r["ratios"]["GMM:0"] for r in own] == [2.0, 1.0, 1.0]      # from the latencies, else re-timed
    t = {(x["kind"], x["variant"], x["timing"]): x for x in tune_history.tally(rows)}
    a = t[("kernel", "ms_cost (rounds of 8, focus 16)", "re-timed")]
    assert (a["wins"], a["tasks"], a["covers"], a["meets_target"]) == (3, 4, "2/2", True)
    b = t[("kernel", "ms_cost", "single")]
    assert (b["wins"], b["tasks"], b["meets_target"]) == (1, 2, False)
    n = t[("network", "ms_cost", "re-timed")]
    assert (n["wins"], n["tasks"]) == (1, 1)
    md = tune_history.table(rows)
    assert "**0.900**" in md and "| 1.300 |" in md and "3/4 (75.0%)" in md
    tune_history.plot(rows, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_a_contender_that_missed_tasks_is_not_judged(tmp_path):
    _kernels(tmp_path / "bench_tune_a.json", {"GMM:0": 0.8, "T2D:0": 0.9, "C2D:0": 0.9})
    (tmp_path / "bench_tune_b.json").write_text(json.dumps({"target": "nvidia/nvidia-h100", "per_task": [
        {"task": "GMM:0", "ratio_model_to_ms_full": 0.5}]}))
    path = tmp_path / "bench_tune_c.json"
    path.write_text(json.dumps({"target": {"kind": "llvm"}, "per_task": [{"task": "GMM:0", "ratio_model_to_ms_full": 0.5}]}))
    t = {(x["target"], x["variant"]): x for x in tune_history.tally(tune_history.runs(tmp_path))}
    assert t[("cpu", "model")]["meets_target"] is None and t[("cpu", "model")]["covers"] == "1/3"
    assert t[("cpu", "ms_cost")]["meets_target"] is True
    assert t[("cuda", "model")]["covers"] == "1/1"       # CUDA tasks are counted apart from CPU ones


def test_no_runs_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["tune_history", "--reports", str(tmp_path), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit) as e:
        tune_history.main()
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_geomean_leaves_out_what_has_no_ratio():
    from pipeline.stats import geomean

    assert geomean([0.5, 2.0, None, 0]) == pytest.approx(1.0)
    assert geomean([4.0, 1.0]) == pytest.approx(2.0)
    assert geomean([None, 0]) is None and geomean([]) is None


def test_network_bench_file_carries_its_time_and_counts_each_network_done(tmp_path):
    import argparse

    from pipeline.bench.tune_model import summarize

    args = argparse.Namespace(model=None, variants=["ms_cost"], final_retime=10)
    rows = [{"network": "mlp", "ms_cost_over_ms": 0.9, "final_ms_cost_over_ms": 1.1},
            {"network": "resnet", "ms_cost_over_ms": 1.2, "final_ms_cost_over_ms": 1.0}]
    out = summarize(rows[:1], "llvm", args, {"cpus": 2})
    assert out["ms_cost_at_or_below_ms"] == "1/1" and out["final_ms_cost_at_or_below_ms"] == "0/1"
    out = summarize(rows, "llvm", args, {"cpus": 2})
    assert out["ms_cost_at_or_below_ms"] == "1/2" and out["final_ms_cost_at_or_below_ms"] == "1/2"
    assert out["finished"][:4].isdigit() and "T" in out["finished"]
    # the history orders files by that time, before the commit that added them
    (tmp_path / "bench_tune_model_y.json").write_text(json.dumps({"target": {"kind": "llvm"}, **out}))
    found = tune_history.runs(tmp_path)
    assert found and all(r["time"] == out["finished"] for r in found)
