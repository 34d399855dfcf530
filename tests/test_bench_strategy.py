"""pipeline.bench.strategy: the variants it is given, and one tiny run with the builds and the GPU
stood in (the scheduler's side real)."""

import json

import pytest


def test_strategy_variants_parse_and_bad_ones_exit_with_one_line():
    from pipeline.bench.strategy import parse_variant

    assert parse_variant("256x2") == (256, 2, None, None)
    assert parse_variant("128X1/16") == (128, 1, 16, None)
    assert parse_variant("128x2/16@32") == (128, 2, 16, 32)
    assert parse_variant("64x1@8") == (64, 1, None, 8)
    for bad in ("256", "x2", "256x2/0", "64x-1", "0x2", "ax2", "128x2@0", "128x2/16@", "128x2@a"):
        with pytest.raises(SystemExit) as err:
            parse_variant(bad)
        assert "\n" not in str(err.value.code)


def test_stood_in_builder_never_hands_metaschedule_a_shared_folder(tmp_path):
    """MetaSchedule's RemoveBuildArtifact removes the artifact's parent folder after a round: an
    artifact folder straight under the temporary directory once took the whole of /tmp with it."""
    import os
    import tempfile

    from pipeline.bench.strategy import artifact_path

    for path in (artifact_path(), artifact_path()):
        parent = os.path.dirname(path)
        assert os.path.isdir(parent) and os.listdir(parent) == []
        assert os.path.realpath(parent) != os.path.realpath(tempfile.gettempdir())
        os.rmdir(parent)


def test_strategy_bench_profiles_a_cuda_search_without_a_gpu(tmp_path):
    from pipeline.bench.strategy import run

    out = tmp_path / "strategy.json"
    run("profiles/gpu.yaml", ["32x1/8", "32x1/8@8"], workloads=1, trials=16, threads=1, out_path=str(out))
    row, halves = json.loads(out.read_text())["runs"]
    assert row["measured"] >= 16 and row["init_min_unmeasured"] == 8
    assert row["trials_per_iter"] == 16 and halves["trials_per_iter"] == 8     # the profile's 16; then 8
    assert halves["measured"] >= 16
    assert row["profile"]["Total"] > 0
    assert (tmp_path / "strategy.png").stat().st_size > 0


def test_replay_first_keeps_to_the_tasks_budget(tmp_path):
    """ReplayFirst's first batch comes out of the task's budget: a task given 8 trials in
    batches of 4 measures 8, not 8 + the replayed 4, even when the run's global budget is larger."""
    import tvm
    from tvm import te

    from pipeline.bench.search_overlap import StandInGPU
    from pipeline.bench.strategy import NoBuild
    from pipeline.space import generator
    from pipeline.tuning import ReplayFirst
    from pipeline.tvm_env import ms

    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    task = ms.TuneContext(mod=mod, target=target, space_generator=generator(target),
                          search_strategy=ReplayFirst(32, 1, 8), task_name="mm", rand_state=0, num_threads=1,
                          logger=ms.logging.get_logger("test.replay_first")).clone()
    ms.tune.tune_tasks(tasks=[task], task_weights=[1.0], work_dir=str(tmp_path), max_trials_global=100,
                       max_trials_per_task=8, num_trials_per_iter=4, builder=NoBuild(), runner=StandInGPU(0.0),
                       database=ms.database.JSONDatabase(work_dir=str(tmp_path)),
                       measure_callbacks=ms.measure_callback.MeasureCallback.create("default"),
                       task_scheduler="round-robin")
    assert len(ms.database.JSONDatabase(work_dir=str(tmp_path))) == 8
