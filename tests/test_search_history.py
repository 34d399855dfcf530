import json

import pytest

from pipeline.bench import search_history


def _bench(path, finished, rates, gpus=("NVIDIA H200, 580.159.04, 143771 MiB",)):
    out = {"machine": {"gpus": list(gpus)}, "workloads": 8, "trials_per_workload": 32,
           "runs": [{"variant": f"v{i}", "measured": 200, "seconds": 80.0, "candidates_per_min": r,
                     "cores_busy": 11.5} for i, r in enumerate(rates)]}
    if finished:
        out["finished"] = finished
    path.write_text(json.dumps(out))


def test_benches_and_campaign_steps_in_time_order_with_the_target_marked(tmp_path):
    _bench(tmp_path / "bench_search_h200_b.json", "2026-12-02T10:00:00", [120.0, 151.0])
    _bench(tmp_path / "bench_search_h100_a.json", "2026-12-01T10:00:00", [90.0, None],
           gpus=("NVIDIA H100 80GB HBM3, 580", "NVIDIA H100 80GB HBM3, 580"))
    (tmp_path / "bench_search_cpu.json").write_text("{}")          # a CPU bench is not a GPU run
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({"time": "2026-12-01T12:00:00", "machine": {"gpus": ["NVIDIA H200, 580"]},
                                "measured": 900, "seconds": 450.0, "candidates_per_min": 120.0,
                                "devices": [0, 0]}) + "\n")
    rows = search_history.history(tmp_path, runs)
    # the run without a rate is left out; order: 12-01 bench, 12-01 campaign, 12-02 bench x 2
    assert [(r["kind"], r["candidates_per_min"]) for r in rows] == [
        ("bench", 90.0), ("campaign", 120.0), ("bench", 120.0), ("bench", 151.0)]
    assert rows[0]["gpu"] == "2 x H100 80GB HBM3" and rows[1]["gpu"] == "H200"
    md = search_history.table(rows)
    assert "**151.0**" in md and "**120.0**" not in md
    assert "H200 bench 151.0/min" in md and "H200 campaign 120.0/min" in md
    search_history.plot(rows, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_no_runs_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["search_history", "--reports", str(tmp_path), "--runs", str(tmp_path / "no.jsonl"),
                                     "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit) as e:
        search_history.main()
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
