"""`evaluate --interim`: an evaluation in steps read from its archive alone, before it is done."""

import json
import pytest
import yaml

from pipeline.cli import main
from pipeline.generate import GenerationParams, sampling_key
from pipeline.registry import model_digest
from pipeline.verify import Outcome


def ok(lat, base=1.0):
    return Outcome("ok", None, lat, base).to_json()


def _result(cons, refs=()):
    return {"construction": cons, "seconds": 1.0, "scripts": [], "complete": [True] * len(cons), "tokens": 10,
            "generation_seconds": 1.0, "retries": 0,
            "refinement": [{"source": s, "attempts": a, "complete": [True] * len(a)} for s, a in refs]}


def _setup(tmp_path, generation: dict):
    """Two model folders, a test split of one workload, and an archive: task a (test) with
    MetaSchedule re-timed and both models' results; b (catalog) with SFT's only; c tuned but
    not re-timed (no baseline yet); te:GMM:0 untimed with SFT's result, and one of an older SFT."""
    models = {}
    for label in ("sft", "rl"):
        d = tmp_path / label
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"label": label}))
        models[label] = str(d)
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "test.jsonl").write_text(json.dumps({"workload": "a", "task": "construction",
                                                                 "prompt": "p", "completion": ""}) + "\n")
    tasks = tmp_path / "archive" / "tasks"
    tasks.mkdir(parents=True)
    key = {label: {"model": model_digest(d), "generation": generation} for label, d in models.items()}
    ms = {"metaschedule": {"key": {}, "outcomes": [ok(0.5), ok(0.25), ok(0.2)]}}
    field = "model:{}:guided:with-refinements"
    (tasks / "a.json").write_text(json.dumps({
        **ms,
        field.format("sft"): {"key": {**key["sft"], "refinements": ["q"]},
                              "result": _result([ok(0.5), Outcome("build", "x").to_json()], [(ok(0.5), [ok(0.25)])])},
        field.format("rl"): {"key": {**key["rl"], "refinements": ["q"]},
                             "result": _result([ok(0.4), ok(0.45)], [(ok(0.5), [ok(0.3)])])},
        # the candidate sampled freely: one decode failure of two
        "model:rl:free:no-refinements": {"key": {**key["rl"], "generation": {**generation, "guided": False},
                                                 "refinements": []},
                                         "result": _result([ok(0.9), Outcome("decode", "x").to_json()])}}))
    (tasks / "b.json").write_text(json.dumps({**ms, field.format("sft"): {"key": {**key["sft"], "refinements": []},
                                                                          "result": _result([ok(2.0), ok(1.0)])}}))
    (tasks / "c.json").write_text(json.dumps({}))
    (tasks / "te_GMM_0.json").write_text(json.dumps({
        "model:sft:guided:no-refinements": {"key": {**key["sft"], "refinements": []},
                                            "result": _result([Outcome("ok").to_json(), Outcome("run", "x").to_json()])},
        "model:rl:guided:no-refinements": {"key": {**key["rl"], "model": "an older model"},
                                           "result": _result([Outcome("ok").to_json()] * 2)}}))
    raw = yaml.safe_load(open("params.yaml"))
    raw["evaluate"].update(models=models, candidate="rl", dataset_dir=str(tmp_path / "dataset"), attempts=2,
                           archive_dir=str(tmp_path / "archive"), te_suite=["GMM:0"], te_timed=[],
                           catalog_workloads=3, metrics=str(tmp_path / "reports" / "metrics.json"))
    raw["sft"]["generation"] = {**generation, "batch_rows": 7, "retry_rows": 2}   # batching: not a result's identity
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    return params


def test_interim_figures_per_model_over_the_tasks_it_finished(tmp_path, capsys):
    g = sampling_key(GenerationParams(attempts=2))
    params = _setup(tmp_path, g)
    assert main(["--params", str(params), "evaluate", "--interim"]) == 0
    out = json.loads((tmp_path / "reports" / "interim.json").read_text())
    sft, rl = out["per_model"]["sft"], out["per_model"]["rl"]
    assert out["tasks_total"] == 1 + 3 + 1 and out["tasks_with_baseline"] == 3    # c has no re-timing yet
    assert sft["tasks_done"] == 3 and rl["tasks_done"] == 1     # rl's te result is an older model's: not counted
    assert sft["construction"]["correctness"] == pytest.approx(4 / 6)
    # sft: a 1/0.5 = 2x, b 1/1.0 = 1x -> sqrt(2); rl: a 1/0.4 = 2.5x
    assert sft["construction"]["speedup_geomean"] == pytest.approx(2 ** 0.5)
    assert rl["construction"]["speedup_geomean"] == pytest.approx(2.5)
    assert out["rl_vs_sft"] == {"construction_wins": 1, "construction_tasks": 1, "refinement_wins": 0,
                                "refinement_prompts": 1}
    assert out["gate_if_final"]["passed"] is False       # rl's latency 0.4 > MS@2's best 0.25
    free = out["free_sampling"]
    assert free["tasks_done"] == 1 and free["construction"]["correctness"] == pytest.approx(0.5)
    assert free["construction"]["failures_by_stage"]["decode"] == 1
    md = (tmp_path / "reports" / "interim.md").read_text()
    assert "interim: rl 1, sft 3 of 5 tasks" in md and "| a | test |" in md and "Free sampling (rl" in md
    assert "rl on 1 of 5 tasks" in capsys.readouterr().out
    # the per-task plot, linked from the report
    assert (tmp_path / "reports" / "interim_speedup.png").read_bytes()[:4] == b"\x89PNG"
    assert "](interim_speedup.png)" in md


def test_interim_without_kept_results_is_a_one_line_error(tmp_path, capsys):
    g = sampling_key(GenerationParams(attempts=2, temperature=0.3))
    params = _setup(tmp_path, g)
    raw = yaml.safe_load(params.read_text())
    raw["sft"]["generation"]["temperature"] = 0.9          # other settings: every kept result is stale
    params.write_text(yaml.safe_dump(raw))
    assert main(["--params", str(params), "evaluate", "--interim"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("little-dragon evaluate --interim:") and "\n" not in err
