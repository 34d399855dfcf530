import collections

import pytest

from pipeline.stages.catalog import verify
from pipeline.tvm_env import structural_hash
from pipeline.workloads import FAMILIES, Spec, UnknownWorkload, build, catalog, held_out_hashes


def test_catalog_is_deterministic_and_seed_shuffles():
    a, b, c = catalog(0), catalog(0), catalog(1)
    assert [s.id for s in a] == [s.id for s in b]
    assert [s.id for s in a] != [s.id for s in c]
    assert {s.id for s in a} == {s.id for s in c}


def test_catalog_covers_families_and_dtypes():
    specs = catalog(0)
    assert len(specs) >= 50_000
    families = collections.Counter(s.family for s in specs)
    assert set(families) == set(FAMILIES)
    assert {s.dtype for s in specs} == {"float32", "float16"}
    assert len({s.id for s in specs}) == len(specs)  # ids are unique


def test_every_family_builds_one_primfunc_main():
    specs = catalog(0)
    for fam in FAMILIES:
        for spec in [s for s in specs if s.family == fam][:2]:
            mod = build(spec)
            assert [gv.name_hint for gv in mod.get_global_vars()] == ["main"]


def test_fp16_kernels_accumulate_in_fp32():
    text = build(Spec("matmul", (16, 64, 64), "float16")).script()
    assert '"float32"' in text and "float16" in text


def test_spec_json_round_trip_and_stable_id():
    spec = Spec("conv2d", (1, 56, 64, 64, 3, 1, 1, 1, 1), "float32")
    assert Spec.from_json(spec.to_json()) == spec
    assert spec.id == Spec.from_json(spec.to_json()).id
    assert spec.id.startswith("conv2d-")


def test_unknown_family_is_a_clear_error():
    with pytest.raises(UnknownWorkload, match="unknown workload family"):
        build(Spec("nope", (1,), "float32"))


def test_held_out_suite_is_loaded():
    held = held_out_hashes()
    assert len(held) >= 50  # te_workload's configurations (Winograd excepted)


@pytest.mark.slow   # 60-120 s on 2 cores: in `make test`'s second phase, so the first stays under 15 min
def test_whole_catalog_distinct_and_disjoint_from_held_out():
    """Builds and hashes all ~56k workloads (about a minute)."""
    report = verify(catalog(0), progress=False)
    assert report["distinct_structural_hashes"] >= 50_000
    assert report["distinct_structural_hashes"] == report["workloads"]
    assert report["held_out_collisions"] == []


def test_a_held_out_workload_would_be_detected():
    from tvm.s_tir.meta_schedule.testing import te_workload

    from pipeline.tvm_env import tvm

    func = te_workload.create_te_workload("SFM", 0)
    assert structural_hash(tvm.IRModule({"main": func})) in held_out_hashes()


def test_held_out_catalog_choice_is_kept_for_the_same_arguments(tmp_path, cpu_target, monkeypatch):
    """pipeline.heldout: the choice (a design space sampled per candidate) is kept in a cache
    file for the same arguments and code; other arguments choose again."""
    from pipeline import heldout, space

    args = dict(corpus_seed=0, corpus_prefix=0, families=["matmul", "softmax"], max_mflop=50,
                max_elements=10**6, exclude_ids=set(), target=cpu_target, cache=tmp_path / "heldout.json")
    first = heldout.catalog_workloads(2, **args)
    assert [s.family for s in first] == ["matmul", "softmax"]
    calls = []
    real = space.sample_many
    monkeypatch.setattr(space, "sample_many", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert heldout.catalog_workloads(2, **args) == first and not calls       # read from the cache
    third = heldout.catalog_workloads(3, **args)
    assert calls and third[:2] == first                                         # chosen again
