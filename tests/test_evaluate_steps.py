"""An evaluation in steps (the GPU profile on a lent machine): `stop_after` ends a step with
work left, finished tasks are kept in `archive_dir` and reused by the next step, even on a
fresh machine (the work folder gone); held-out catalog workloads join the tasks."""

import json
import shutil
from pathlib import Path

import pytest

from helpers import SPEC, eval_params

pytestmark = pytest.mark.slow      # multi-minute, run by `make test`'s second phase (-m slow)


def _setup(tmp_path, cpu_target) -> Path:
    return eval_params(tmp_path, cpu_target,
                       search=dict(families=["softmax", "layer_norm"], max_mflop=2, max_elements=200_000,
                                   population_size=64, genetic_num_iters=1),
                       te_suite=[], te_timed=[], attempts=2, metaschedule_trials=4, catalog_workloads=1,
                       refinement_prompts=2, archive_dir=str(tmp_path / "kept"),
                       metrics=str(tmp_path / "metrics.json"), report=str(tmp_path / "evaluation.md"))


def test_an_evaluation_in_steps_reuses_what_it_kept(tmp_path, cpu_target):
    import time

    from pipeline.stages import evaluate as ev

    params = _setup(tmp_path, cpu_target)
    t0 = time.perf_counter()
    first = ev.main(str(params), progress=False, stop_after=1.0)        # one MetaSchedule run, then out of time
    assert len(first["incomplete"]["metaschedule"]) == 1                # the catalog task's run is left
    assert not (tmp_path / "metrics.json").exists()
    kept = [p.name for p in (tmp_path / "kept" / "metaschedule").glob("*.tar.xz")]
    assert kept == [f"{ev._dirname(SPEC.id)}.tar.xz"]                    # the test task's run, kept
    summary = json.loads((tmp_path / "evaluate" / ev._dirname(SPEC.id) / "summary.json").read_text())

    shutil.rmtree(tmp_path / "evaluate")                                # a fresh machine: only the kept files
    second = ev.main(str(params), progress=False)
    assert "incomplete" not in second, second
    assert second["tasks"] == {"test": 1, "catalog": 1, "te_workload": 0}
    again = json.loads((tmp_path / "evaluate" / ev._dirname(SPEC.id) / "summary.json").read_text())
    assert again["seconds"] == summary["seconds"]                       # read back, not tuned again
    catalog_key = first["incomplete"]["metaschedule"][0]
    assert catalog_key != SPEC.id and not catalog_key.startswith("te:")
    cached = json.loads((tmp_path / "kept" / "tasks" / f"{catalog_key}.json").read_text())
    assert len(cached["metaschedule"]["outcomes"]) == 4
    assert any(k.startswith("model:rl:guided") for k in cached)

    t1 = time.perf_counter()
    third = ev.main(str(params), progress=False)                        # everything kept: the same figures
    print(f"steps 1+2: {t1 - t0:.0f} s, step 3 (all kept): {time.perf_counter() - t1:.0f} s")
    assert third["construction"] == second["construction"] and third["refinement"] == second["refinement"]
    assert third["samples"] == second["samples"]


def test_the_metaschedule_phase_runs_in_parts_without_a_model(tmp_path, cpu_target):
    """One process per GPU: `part` splits the tasks, `metaschedule_only` needs no model, and
    both keep their runs in the shared archive for the full evaluation."""
    import yaml

    from pipeline.stages import evaluate as ev

    params = _setup(tmp_path, cpu_target)
    raw = yaml.safe_load(params.read_text())
    raw["evaluate"]["models"] = {"sft": str(tmp_path / "absent-sft"), "rl": str(tmp_path / "absent-rl")}
    params.write_text(yaml.safe_dump(raw))
    first = ev.main(str(params), progress=False, part=(0, 2), metaschedule_only=True)
    second = ev.main(str(params), progress=False, part=(1, 2), metaschedule_only=True)
    assert first == {"incomplete": {}, "tasks": [SPEC.id]}               # the test task; the catalog task is part 1
    assert len(second["tasks"]) == 1 and second["tasks"][0] != SPEC.id
    kept = sorted(p.name for p in (tmp_path / "kept" / "metaschedule").glob("*.tar.xz"))
    assert kept == sorted(f"{ev._dirname(k)}.tar.xz" for k in first["tasks"] + second["tasks"])
    for key in first["tasks"] + second["tasks"]:
        cached = json.loads((tmp_path / "kept" / "tasks" / f"{ev._dirname(key)}.json").read_text())
        assert len(cached["metaschedule"]["outcomes"]) == 4 and not any(k.startswith("model:") for k in cached)
    assert not (tmp_path / "metrics.json").exists()
    with pytest.raises(FileNotFoundError, match="does not exist"):     # the full evaluation needs the model
        ev.main(str(params), progress=False)


def test_the_metaschedule_phase_tunes_tasks_in_groups(tmp_path, cpu_target):
    """evaluate.metaschedule_group = 2: the test task and the catalog task in one MetaSchedule
    run, each kept with its own database; the next step reads both back."""
    import yaml

    from pipeline.stages import evaluate as ev

    params = _setup(tmp_path, cpu_target)
    raw = yaml.safe_load(params.read_text())
    raw["evaluate"]["metaschedule_group"] = 2
    params.write_text(yaml.safe_dump(raw))
    first = ev.main(str(params), progress=False, metaschedule_only=True)
    keys = first["tasks"]
    assert len(keys) == 2 and first["incomplete"] == {}
    summaries = [json.loads((tmp_path / "evaluate" / ev._dirname(k) / "summary.json").read_text()) for k in keys]
    assert all(s["group_run"]["tasks"] == keys and s["settings"]["tasks_per_run"] == 2 for s in summaries)
    shutil.rmtree(tmp_path / "evaluate")                                # a fresh machine: only the kept files
    again = ev.main(str(params), progress=False, metaschedule_only=True)
    assert again == first
    for k, s in zip(keys, summaries):
        assert json.loads((tmp_path / "evaluate" / ev._dirname(k) / "summary.json").read_text()) == s


def test_the_models_phase_runs_alone_on_the_kept_runs(tmp_path, cpu_target):
    """`models_only`: the models write for the tasks whose MetaSchedule run is kept, and no new
    MetaSchedule run starts; the other tasks are left, listed, for a later step."""
    from pipeline import params as P
    from pipeline.stages import evaluate as ev

    params = _setup(tmp_path, cpu_target)
    first = ev.main(str(params), progress=False, stop_after=1.0, metaschedule_only=True)   # one run, then out of time
    (left,) = first["incomplete"]["metaschedule"]
    tars = tmp_path / "kept" / "metaschedule"
    kept = {p.name: p.read_bytes() for p in tars.glob("*.tar.xz")}
    assert list(kept) == [f"{ev._dirname(SPEC.id)}.tar.xz"]
    out = ev.main(str(params), progress=False, models_only=True)
    assert out["incomplete"]["metaschedule"] == [left] and out["incomplete"]["rl"] == [left]
    assert {p.name: p.read_bytes() for p in tars.glob("*.tar.xz")} == kept      # nothing tuned
    cached = json.loads((tmp_path / "kept" / "tasks" / f"{ev._dirname(SPEC.id)}.json").read_text())
    assert any(k.startswith("model:rl:guided") for k in cached)
    other = tmp_path / "kept" / "tasks" / f"{ev._dirname(left)}.json"
    assert not other.exists() or not any(k.startswith("model:") for k in json.loads(other.read_text()))
    with pytest.raises(P.ParamsError, match="exclude each other"):
        ev.main(str(params), progress=False, metaschedule_only=True, models_only=True)


def test_the_candidate_with_a_cost_model_is_reported_beside_it(tmp_path, cpu_target, monkeypatch):
    """evaluate.rerank_oversample: the candidate writes 2K scripts per construction prompt and
    the cost model's K best are checked, as "<candidate>+cm", construction only, not gated;
    the plain candidate's figures are unchanged by it (the same kept results)."""
    from pipeline import cost_model
    from pipeline.stages import evaluate as ev

    monkeypatch.setattr(cost_model, "CAMPAIGNS", {})     # no campaign: the cost model learns nothing ahead
    params = eval_params(tmp_path, cpu_target, te_suite=[], te_timed=[], attempts=2, metaschedule_trials=4,
                         refinement_prompts=1, rerank_oversample=2, archive_dir=str(tmp_path / "kept"),
                         metrics=str(tmp_path / "metrics.json"), report=str(tmp_path / "evaluation.md"))
    m = ev.main(str(params), progress=False)
    cm = m["models"]["rl+cm"]
    assert cm["rerank"] == {"oversample": 2, "written_per_prompt": 4, "compile_check": False, "compile_rejected": 0}
    assert cm["construction"]["attempts"] == 2 and cm["refinement"]["attempts"] == 0
    assert cm["gate"]["passed"] is None and "rl+cm" in (tmp_path / "evaluation.md").read_text()
    kept = json.loads((tmp_path / "kept" / "tasks" / f"{SPEC.id}.json").read_text())
    result = kept["model:rl+cm:guided:no-refinements"]["result"]
    assert result["written"] == 4 and len(result["construction"]) == 2
    assert len(set(result["scripts"])) == len(result["scripts"])     # distinct picks
    # the plain candidate, evaluated in the same run, keeps its own K attempts
    assert m["models"]["rl"]["construction"]["attempts"] == 2
    assert "model:rl:guided:with-refinements" in kept or "model:rl:guided:no-refinements" in kept
    assert m["candidate"] == "rl" and m["construction"] == m["models"]["rl"]["construction"]
    # one plot column a task, every model (the cost model's picks too) beside MetaSchedule
    assert (tmp_path / "eval_speedup.png").read_bytes()[:4] == b"\x89PNG"

