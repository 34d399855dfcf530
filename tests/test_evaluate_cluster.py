"""The evaluation on a Dask cluster (one job per task) gives the same scripts and checks as
the evaluation in one process, and hands MetaSchedule's results back to the tasks."""

from pathlib import Path

import pytest
import yaml

from helpers import SPEC, eval_params

pytestmark = pytest.mark.slow      # multi-minute, run by `make test`'s second phase (-m slow)


def _setup(tmp_path, cpu_target) -> Path:
    path = eval_params(tmp_path, cpu_target, te_suite=["SFM:0"], te_timed=[], attempts=2, metaschedule_trials=4,
                       cluster_workers=2)
    # a Dask job writes one task; one process batches several tasks' rows unless a batch holds
    # only one task's (sampling then differs): batches of 2 rows give both the same batches
    raw = yaml.safe_load(path.read_text())
    raw["sft"]["generation"]["batch_rows"] = 2
    path.write_text(yaml.safe_dump(raw))
    return path


def test_evaluation_on_dask_matches_one_process(tmp_path, cpu_target):
    import dataclasses

    from pipeline import params as P, records
    from pipeline.generate import GenerationParams
    from pipeline.reward import Measurer
    from pipeline.stages import evaluate as ev
    from pipeline.stages.search import SearchParams

    path = _setup(tmp_path, cpu_target)
    raw = yaml.safe_load(path.read_text())
    p = P.load("evaluate", ev.EvalParams, str(path))
    sp = P.from_dict(SearchParams, raw["search"], "search")
    g = P.from_dict(GenerationParams, {**raw["sft"].get("generation", {}), "attempts": p.attempts}, "sft.generation")
    measurer = Measurer(records.workload_entries(sp.work_dir), raw["search"]["target"], p.timeout_s, p.workers)
    here = ev.make_tasks(p, measurer.specs, cpu_target)
    local, _ = ev.evaluate_tasks(p, here, ["rl"], g, measurer, sp, cpu_target, 4, False, progress=False)
    there = ev.make_tasks(p, measurer.specs, cpu_target)
    dask, _ = ev.evaluate_on_cluster(str(path), dataclasses.replace(p, cluster="local"), there, ["rl"], False,
                                     progress=False)
    assert [t.key for t in here] == [SPEC.id, "te:SFM:0"]
    for a, b in zip(here, there):
        ra, rb = local["rl"][a.key], dask["rl"][b.key]
        assert ra["scripts"] == rb["scripts"] and len(ra["scripts"]) == 2
        assert [o.stage for o in ra["construction"]] == [o.stage for o in rb["construction"]]
        assert len(a.ms_outcomes) == len(b.ms_outcomes) and [q for q, _ in a.refinements] == [q for q, _ in b.refinements]
    assert len(there[0].ms_outcomes) == 4 and there[0].ms_seconds > 0      # MetaSchedule's run came back


def test_a_cluster_evaluation_past_its_stop_after_leaves_its_tasks(tmp_path, cpu_target):
    """--stop-after with evaluate.cluster: jobs that start past the deadline leave their tasks,
    which `missing` then lists for the next step."""
    import dataclasses
    import time

    from pipeline import params as P, records
    from pipeline.reward import Measurer
    from pipeline.stages import evaluate as ev

    path = _setup(tmp_path, cpu_target)
    p = P.load("evaluate", ev.EvalParams, str(path))
    raw = yaml.safe_load(path.read_text())
    measurer = Measurer(records.workload_entries(raw["search"]["work_dir"]), raw["search"]["target"], p.timeout_s, 1)
    tasks = ev.make_tasks(p, measurer.specs, cpu_target)
    results, _ = ev.evaluate_on_cluster(str(path), dataclasses.replace(p, cluster="local"), tasks, ["rl"], False,
                                        progress=False, deadline=time.time() - 1)
    assert results == {"rl": {}} and not any(t.ms_scripts for t in tasks)
    assert ev.missing(tasks, results, None) == {"metaschedule": [SPEC.id], "rl": [SPEC.id, "te:SFM:0"]}
