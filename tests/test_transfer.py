"""Transfer (pipeline.transfer): a measured script of one workload carried onto another of its
family through the new kernel's sketch, the library of a campaign's fastest scripts, and the
carried scripts as MetaSchedule's first batch (ModelFirst with a proposer)."""

import pytest

from helpers import SPEC
from pipeline import transfer
from pipeline.sketch import sketches
from pipeline.space import sample_many
from pipeline.tvm_env import Schedule, structural_hash, tvm
from pipeline.workloads import Spec, build

OTHER = Spec("matmul", (8, 32, 48), "float32")


def test_nearest_keeps_a_valid_decision_and_else_matches_the_inner_tiles():
    tiles = [(64, 1), (16, 4), (8, 8), (4, 16)]
    assert transfer.nearest("SamplePerfectTile", tiles, (8, 8)) == (8, 8)
    # an extent the source tile does not divide: the inner (cache / vector) factor decides
    assert transfer.nearest("SamplePerfectTile", tiles, (2, 4)) == (16, 4)
    assert transfer.nearest("SampleCategorical", [0, 1, 2], 2) == 2
    assert transfer.nearest("SampleComputeLocation", [-2, -1, 0, 1], 3) == 1


def test_first_picks_by_cost_model_or_least_changed_one_per_source_first():
    a0, a1, b0 = (transfer.Source(w, r, 1e-3, (), ()) for w, r in (("a", 0), ("a", 1), ("b", 0)))
    props = [transfer.Proposal(a0, None, 0.0), transfer.Proposal(a1, None, 0.5), transfer.Proposal(b0, None, 2.0)]
    assert transfer.first(props, 2, [0.1, 0.9, 0.5]) == [1, 2]
    assert transfer.first(props, 2) == [0, 1]                 # no scores: in proposal order
    # nearest: a's least changed, then b's (every source workload once), then a's second
    assert transfer.first(props, 3, [0.1, 0.9, 0.5], rank="nearest") == [0, 2, 1]
    with pytest.raises(ValueError, match="cost or nearest"):
        transfer.first(props, 1, rank="fastest")


def _source(mod, target, seed=3):
    sch = sample_many(mod, target, 1, seed=seed)[0]
    return sch.trace.simplified(remove_postproc=True)


def test_a_script_carried_onto_its_own_kernel_is_itself_and_onto_another_shape_is_a_valid_candidate(cpu_target):
    mod, other = build(SPEC), build(OTHER)
    src = _source(mod, cpu_target)
    sig = transfer.signature(src)
    own = [sk for sk in sketches(mod, cpu_target) if transfer.signature(sk) == sig]
    theirs = [sk for sk in sketches(other, cpu_target) if transfer.signature(sk) == sig]
    assert own and theirs          # one family, one shape of sketch, whatever the extents
    old = transfer.decisions(src)
    same, unchanged = transfer.retarget(mod, cpu_target, own[0], old)
    assert transfer.decisions(same.trace.simplified(remove_postproc=True)) == old and unchanged == 0
    moved, changed = transfer.retarget(other, cpu_target, theirs[0], old)
    new = transfer.decisions(moved.trace.simplified(remove_postproc=True))
    assert len(new) == len(old) and new != old and changed > 0
    # it is postprocessed (parallel / vectorize made real) and builds
    assert any(inst.kind.name == "EnterPostproc" for inst in moved.trace.insts)
    tvm.compile(moved.mod, target=cpu_target)


def test_a_kernel_of_another_family_gets_nothing(tmp_path, cpu_target):
    from test_cost_model import _database

    _database(tmp_path / "search", cpu_target, [SPEC], 6)
    lib = transfer.Library(cpu_target, tmp_path / "search", per_workload=2)
    softmax = build(Spec("softmax", (4, 64), "float32"))
    assert lib.sources and lib.propose(softmax) == []
    assert transfer.Library(cpu_target, None).propose(build(SPEC)) == []      # no campaign: nothing carried


def test_the_library_keeps_each_workloads_fastest_leaves_out_exclusions_and_proposes_unique_scripts(tmp_path, cpu_target):
    from pipeline import records
    from test_cost_model import _database

    third = Spec("matmul", (32, 16, 64), "float32")
    _database(tmp_path / "search", cpu_target, [SPEC, OTHER], 10)
    lib = transfer.Library(cpu_target, tmp_path / "search", exclude={OTHER.id}, per_workload=2)
    assert [s.workload for s in lib.sources] == [SPEC.id, SPEC.id] and [s.rank for s in lib.sources] == [0, 1]
    lats = sorted(r.latency_s for shard in records.shard_dirs(tmp_path / "search") for r in records.scan(shard)
                  if r.workload_hash == str(structural_hash(build(SPEC))))
    assert [s.latency_s for s in lib.sources] == lats[:2]
    got = lib.propose(build(third))
    assert got and all(isinstance(p.sch, Schedule) for p in got)
    assert len({str(p.sch.trace) for p in got}) == len(got)
    assert len(lib.propose(build(third), limit=1)) == 1


def test_modelfirst_measures_the_carried_scripts_first(tmp_path, cpu_target):
    # MetaSchedule's own tuning (tune_tasks, as the bench tunes), not ms.tune_tir: TVM's
    # tune_tir fails the second time in one pytest process (test_cost_model says why)
    from pipeline import codec, metaschedule
    from pipeline.model_strategy import ModelFirst
    from pipeline.params import from_dict
    from pipeline.stages.search import SearchParams
    from test_cost_model import _database

    with pytest.raises(ValueError, match="model or a proposer"):
        ModelFirst()
    _database(tmp_path / "search", cpu_target, [OTHER], 8)
    lib = transfer.Library(cpu_target, tmp_path / "search", per_workload=4)
    mod = build(SPEC)
    strategy = ModelFirst(proposer=lib, batch=4, population_size=16, genetic_num_iters=1)
    sp = from_dict(SearchParams, dict(target={"kind": "llvm", "num-cores": 2}, families=["matmul"], num_workloads=1,
                                      trials_per_workload=8, trials_per_iter=4, population_size=16,
                                      genetic_num_iters=1, builder_workers=1, run_timeout_s=10, min_repeat_ms=5))
    tuned = metaschedule.tune(mod, cpu_target, 8, tmp_path / "ms", sp, "transfer", strategy=strategy)
    assert len(strategy.proposed) == 4 and all(p.startswith(OTHER.id) for p in strategy.proposed)
    assert tuned.trials == 8

    def key(script):
        sch = Schedule(mod, debug_mask=0)
        codec.decode(mod, script, cpu_target).apply_to_schedule(sch, remove_postproc=False)
        return structural_hash(sch.mod)

    # the first round is 4 of the carried scripts, as carried; the evolutionary search fills the rest
    carried = {structural_hash(p.sch.mod) for p in lib.propose(mod)}
    assert {key(x) for x in tuned.scripts[:4]} <= carried


def test_a_source_with_a_unit_loop_more_matches_without_its_tile():
    sig = (("SamplePerfectTile", 4, 64), ("SamplePerfectTile", 2, 64), ("SamplePerfectTile", 2, 64),
           ("SampleCategorical", 4))
    old = ((2, 2, 2, 2), (1, 1), (3, 1), 2)
    assert transfer.without_unit_tiles(sig, old) == ((sig[0], sig[2], sig[3]), (old[0], old[2], old[3]))
    src = transfer.Source("w", 0, 1e-3, sig, old)
    assert src.matches({sig: ["exact"]}) == (["exact"], old)
    assert src.matches({(sig[0], sig[2], sig[3]): ["loose"]}) == (["loose"], (old[0], old[2], old[3]))
    assert src.matches({}) == ([], (old[0], old[2], old[3]))


def test_campaign_unpacks_the_targets_git_campaign_for_the_block_only(tmp_path, cpu_target):
    # one lookup for the cost model and the transfer library (pipeline.cost_model.campaign)
    from pathlib import Path

    from pipeline import cost_model, records
    from test_cost_model import _database

    with cost_model.campaign(cpu_target) as (folder, exclude, source):
        assert source == "databases/search-cpu" and len(records.shard_dirs(folder)) >= 8
        assert exclude and exclude <= {w["id"] for w in records.workload_entries(folder).values()}
        entries, by_workload = cost_model.campaign_records(folder, "llvm", exclude, measured_only=True)
        assert by_workload and not {entries[h]["id"] for h in by_workload} & exclude
        assert all(r.latency_s is not None for refs in by_workload.values() for r in refs)
    assert not Path(folder).exists()                      # the unpacked copy is gone after the block
    with cost_model.campaign("opencl") as (folder, exclude, source):
        assert (folder, exclude, source) == (None, set(), "none")
    _database(tmp_path / "search", cpu_target, [SPEC], 4)
    with cost_model.campaign(cpu_target, tmp_path / "search") as (folder, exclude, source):
        assert folder == tmp_path / "search" and source == str(tmp_path / "search")
