"""Overlapped building and measuring (pipeline/overlap.py) on real MetaSchedule runs with the
CUDA target, which lowers and builds here; the GPU's measurements are stood in for."""

import json

import pytest

from pipeline import files
from pipeline.params import ParamsError, from_dict
from pipeline.stages.search import SearchParams, run_search


def _params(tmp_path, **over):
    # one round a task, sampled from the design space (ReplayFirst): small CUDA matmuls have
    # too few valid points for an evolutionary round's population
    values = dict(target="nvidia/nvidia-h100", families=["matmul"], num_workloads=2, trials_per_workload=8,
                  trials_per_iter=8, max_mflop=2, max_elements=200000, population_size=64, genetic_num_iters=1,
                  first_round="replay",
                  shard_size=2, run_timeout_s=10, min_repeat_ms=5, builder_workers=2,
                  work_dir=str(tmp_path / "search"), report=str(tmp_path / "search.json"))
    values.update(over)
    return from_dict(SearchParams, values)


def _tune(tmp_path, p, overlap: bool, run_ms: float):
    from pipeline import tuning
    from pipeline.bench.search_overlap import StandInGPU
    from pipeline.overlap import OverlapBuilder
    from pipeline.stages.search import select_workloads
    from pipeline.tvm_env import make_target, ms
    from pipeline.workloads import build

    mods = [(s.id, build(s)) for s in select_workloads(p)]
    pool = (OverlapBuilder if overlap else tuning.PoolBuilder)(2, 30, tuning.Phases())
    work = tmp_path / ("overlap" if overlap else "in-turns")
    work.mkdir()
    try:
        phases = tuning.tune(p, make_target(p.target), mods, work, 8, 8, pool=pool, overlap=overlap,
                             runner=StandInGPU(run_ms))
    finally:
        pool.shutdown()
    db = ms.database.JSONDatabase(work_dir=str(work))
    return phases, [r for r in db.get_all_tuning_records()]


def test_overlapped_search_measures_every_candidate_while_the_next_task_searches(tmp_path):
    """Two tasks, up to 8 candidates each, a stand-in GPU taking 0.25 s a candidate. In turns (TVM's
    way) the scheduler waits inside Runner.run for every measurement; overlapped it never
    does, yet every candidate is measured and stored."""
    p = _params(tmp_path)
    in_turns, records_a = _tune(tmp_path, p, overlap=False, run_ms=250)
    overlapped, records_b = _tune(tmp_path, p, overlap=True, run_ms=250)
    # every candidate sent to the builder is measured and stored (a design space sample can fail
    # its postprocessors, so a task may send fewer than its 8)
    assert len(records_a) == in_turns.candidates and len(records_b) == overlapped.candidates >= 12
    assert all(r.run_secs and float(r.run_secs[0]) < 1e9 for r in records_b)
    assert in_turns.run_s >= in_turns.candidates * 0.25 and in_turns.measure_busy_s == 0
    assert overlapped.run_s < 0.5 and overlapped.measure_busy_s >= overlapped.candidates * 0.25
    assert overlapped.build_busy_s > 0 and overlapped.rounds == 2

@pytest.mark.slow     # every build times out: a worker restart (a TVM import) per candidate
def test_a_failed_build_is_a_failed_record_logged_as_a_build_error(tmp_path):
    """Builds that time out (0.001 s) reach MetaSchedule as runner results carrying the
    builder's message: stored as failed, and the stage's error log says 'build'."""
    summary = run_search(_params(tmp_path, num_workloads=1, shard_size=1, trials_per_workload=4, trials_per_iter=4,
                                 overlap=True, baselines_beside=True, build_timeout_s=0.001), progress=False)
    errors = list(files.read_jsonl(tmp_path / "search" / "shard-0000" / "errors.jsonl"))
    assert len(errors) == summary["trials"] == summary["failed_trials"] >= 4
    assert all(e["stage"] == "build" and e["error"].startswith("LocalBuilder: Timeout") for e in errors)
    assert summary["this_run"]["overlap"] is True
    # the DLight baseline was built and timed on a thread beside the tuning (no GPU here: its error)
    (baseline,) = json.loads((tmp_path / "search" / "shard-0000" / "baselines.json").read_text()).values()
    assert baseline["latency_s"] or baseline["error"].startswith("no cuda device")
    assert next(files.read_jsonl(tmp_path / "search" / "throughput.jsonl"))["baselines_beside"] is True


def test_overlap_is_refused_where_it_would_time_cpu_kernels_beside_builds(tmp_path, matmul_mod, cpu_target):
    from pipeline import tuning

    p = _params(tmp_path, target={"kind": "llvm", "num-cores": 2})
    with pytest.raises(ValueError, match="GPU targets only"):
        tuning.tune(p, cpu_target, [("m", matmul_mod)], tmp_path / "w", 4, 4, overlap=True)
    with pytest.raises(ParamsError, match="persistent_builder"):
        _params(tmp_path, overlap=True, persistent_builder=False)


def test_the_build_pool_is_never_recycled_under_builds_in_flight(matmul_mod, cpu_target):
    """Recycling (PoolBuilder's guard against leaky workers) would kill builds still running:
    with builds in flight the pool is kept past `recycle_after`, and replaced once idle."""
    import os

    from pipeline.overlap import OverlapBuilder
    from pipeline.tuning import Phases
    from pipeline.tvm_env import ms

    builder = OverlapBuilder(1, 60, Phases(), recycle_after=1)
    inputs = [ms.builder.BuilderInput(matmul_mod, cpu_target)]
    try:
        first = builder.build(inputs)[0].artifact_path          # the worker starts: seconds
        pool = builder._pool
        second = builder.build(inputs)[0].artifact_path         # past recycle_after, first in flight
        assert builder._pool is pool
        assert builder.wait(first) is None and builder.wait(second) is None
        assert os.path.getsize(first) > 0 and os.path.getsize(second) > 0
        builder.build(inputs)                                    # idle now: replaced
        assert builder._pool is not pool
    finally:
        builder.shutdown()


def test_a_recycled_pool_hands_over_to_workers_started_beside_its_last_round(matmul_mod, cpu_target):
    """PoolBuilder replaces its workers every `recycle_after` rounds (the guard against leaky
    workers). The successor's workers start during the old pool's last round, and the first
    pool's before the first round (`warm`), so no round's builds wait for workers to import TVM
    (5-16 s on 2 cores; on the GPU machine once every 2 shards of the campaign)."""
    from pipeline.tuning import Phases, PoolBuilder
    from pipeline.tvm_env import ms

    builder = PoolBuilder(1, 60, Phases(), recycle_after=2)
    inputs = [ms.builder.BuilderInput(matmul_mod, cpu_target)]
    try:
        builder.warm()
        first = builder._next
        assert all(f.result(timeout=120) for f in first.started)        # up before any build was asked
        assert builder.build(inputs)[0].error_msg is None and builder._pool is first and builder._next is None
        assert builder.build(inputs)[0].error_msg is None                # the first pool's last round
        successor = builder._next
        assert successor is not None and successor is not first
        assert all(f.result(timeout=120) for f in successor.started)
        assert builder.build(inputs)[0].error_msg is None and builder._pool is successor
    finally:
        builder.shutdown()
    assert builder._pool is None and builder._next is None
