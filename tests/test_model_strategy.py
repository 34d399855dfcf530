"""The model as a MetaSchedule search strategy: `ms.tune_tir(..., strategy=ModelFirst(dir))`
measures the model's scripts first, then MetaSchedule's own search fills the budget."""

import pytest

from helpers import SPEC, tiny_model


@pytest.mark.slow     # ~65 s: the default run keeps under 15 min (CI runs it in its slow phase)
def test_tune_tir_takes_the_model_as_its_strategy(tmp_path, cpu_target):
    from pipeline import codec
    from pipeline.model_strategy import ModelFirst
    from pipeline.tvm_env import worker_init
    from pipeline.tvm_env import Schedule, ms, structural_hash
    from pipeline.workloads import build

    tiny_model(tmp_path / "model", cpu_target, steps=60)
    mod = build(SPEC)
    strategy = ModelFirst(str(tmp_path / "model"), batch=4, population_size=16, genetic_num_iters=1)
    # rounds of 8: the model's batch of 4, then MetaSchedule's evolutionary search with what is
    # left of the budget (it was given all of it and measured a whole round more: 12 for 8)
    db = ms.tune_tir(mod, cpu_target, str(tmp_path / "ms"), max_trials_global=8, num_trials_per_iter=8,
                     strategy=strategy,   # workers with the project's import fix: seconds, not a minute, per round
                     builder=ms.builder.LocalBuilder(max_workers=1, initializer=worker_init),
                     runner=ms.runner.LocalRunner(initializer=worker_init))
    records = db.get_all_tuning_records()
    assert len(strategy.proposed) == 4 and len(records) == 8

    def key(trace):
        sch = Schedule(mod, debug_mask=0)
        trace.apply_to_schedule(sch, remove_postproc=False)
        return structural_hash(sch.mod)

    # the model's 4 scripts are among the measured candidates, as written, and all of them ran
    ran = {key(r.trace) for r in records if r.run_secs and float(r.run_secs[0]) < 1e9}
    assert {key(codec.decode(mod, s, cpu_target)) for s in strategy.proposed} <= ran
