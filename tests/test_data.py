"""Training data: examples from a real (tiny) search, splits, corpus, and GX validation."""

import json

import pandas as pd
import pytest

from pipeline import records
from pipeline.stages import data as dataset
from pipeline.stages import validate
from pipeline.params import from_dict
from pipeline.stages.search import SearchParams, run_search

TARGET = {"kind": "llvm", "num-cores": 2}


@pytest.fixture(scope="module")
def search_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    p = from_dict(SearchParams, dict(
        target=TARGET, families=["matmul", "softmax", "pool2d"], num_workloads=3, trials_per_workload=8,
        trials_per_iter=8, max_mflop=2, max_elements=50000, population_size=16, genetic_num_iters=1,
        shard_size=3, run_timeout_s=10, min_repeat_ms=5, work_dir=str(root / "search"), report=str(root / "s.json")))
    run_search(p, progress=False)
    return root / "search"


@pytest.fixture(scope="module")
def examples(search_dir):
    p = from_dict(dataset.DataParams, dict(search_dir=str(search_dir), min_speedup=1.05,
                                           top_k_construction=3, val_fraction=0.34, test_fraction=0.34))
    rows, stats = dataset.build_examples(p, progress=False)
    return p, rows, stats


def test_examples_have_both_tasks_and_measured_columns(examples):
    p, rows, stats = examples
    tasks = {r["task"] for r in rows}
    assert tasks == {"construction", "refinement"}
    for r in rows:
        assert r["latency_s"] > 0 and r["completion"]
        if r["task"] == "refinement":
            assert r["speedup_vs_source"] >= p.min_speedup
            assert r["source_latency_s"] > r["latency_s"]
            assert "### current script" in r["prompt"]
    assert stats["records"] >= 8


def test_splits_are_by_workload_and_rows_unique(examples):
    _, rows, _ = examples
    split_of = {}
    for r in rows:
        assert split_of.setdefault(r["workload"], r["split"]) == r["split"]
    assert set(split_of.values()) == {"train", "val", "test"}
    assert len({(r["prompt"], r["completion"]) for r in rows}) == len(rows)


def test_prompt_describes_the_ir_not_the_family_name(examples):
    _, rows, _ = examples
    for r in rows:
        assert "block " in r["prompt"] and "args:" in r["prompt"]


def test_records_are_in_the_canonical_guided_form(examples):
    _, rows, stats = examples
    # measured scripts are written in the form the guided decoder writes, nearly all inside its space
    assert stats["scripts_encoded"] >= 8 and stats["scripts_in_guided_space"] >= 0.9 * stats["scripts_encoded"]
    assert not any(r["completion"].endswith("NOPOST") for r in rows)


def _frame(rows):
    return pd.DataFrame(rows)[validate.COLUMNS]


def _validate(df, tmp_path, min_examples=1):
    p = from_dict(validate.ValidateParams, dict(min_examples=min_examples, gx_dir=str(tmp_path / "gx"),
                                                docs_dir=str(tmp_path / "docs"), report=str(tmp_path / "v.json")))
    return validate.failures(validate.run_validation(df, p, min_speedup=1.05))


def test_validation_passes_on_good_data(examples, search_dir, tmp_path):
    _, rows, _ = examples
    df = validate.add_derived_columns(_frame(rows), TARGET, records.workload_entries(search_dir))
    assert _validate(df, tmp_path) == []
    assert (tmp_path / "docs" / "index.html").exists()


@pytest.mark.parametrize("corrupt,expected", [
    (lambda df: df.assign(latency_s=-df["latency_s"]), "expect_column_values_to_be_between on latency_s"),
    (lambda df: df.assign(completion=df["completion"].where(df.index != 0, "T l0 garbage")), "expect_column_values_to_be_in_set on roundtrip_ok"),
    (lambda df: df.assign(split=df["split"].where(df.index != 0, "test" if df.loc[0, "split"] != "test" else "train")), "splits_of_workload"),
    (lambda df: df.assign(speedup_vs_source=df["speedup_vs_source"] * 0.5), "speedup_vs_source"),
    (lambda df: pd.concat([df, df.iloc[:1]], ignore_index=True), "expect_compound_columns_to_be_unique"),
])
def test_corrupted_data_fails_and_names_the_expectation(examples, search_dir, tmp_path, corrupt, expected):
    _, rows, _ = examples
    df = validate.add_derived_columns(corrupt(_frame(rows)), TARGET, records.workload_entries(search_dir))
    bad = _validate(df, tmp_path)
    assert any(expected in line for line in bad), bad


def test_too_few_examples_fail(examples, search_dir, tmp_path):
    _, rows, _ = examples
    df = validate.add_derived_columns(_frame(rows), TARGET, records.workload_entries(search_dir))
    bad = _validate(df, tmp_path, min_examples=10**6)
    assert any("expect_table_row_count_to_be_between" in line for line in bad)


def test_sample_pairs_exact_and_bounded():
    import random

    lat = [1.0, 2.0, 1.02, 4.0]
    pairs = dataset.sample_pairs(lat, 1.05, 100, random.Random(0))
    assert sorted(pairs) == sorted((i, j) for i in range(4) for j in range(4) if lat[i] >= 1.05 * lat[j])
    gen = random.Random(1)
    big = [gen.random() + 0.01 for _ in range(5000)]
    sampled = dataset.sample_pairs(big, 1.05, 300, random.Random(0))
    assert len(sampled) == 300 and len(set(sampled)) == 300
    assert all(big[i] >= 1.05 * big[j] for i, j in sampled)


def test_streaming_benchmark_on_synthetic_records():
    from pipeline.bench import records as bench_records

    result = bench_records.run(20_000)
    assert result["records"] == 20_000
    assert 0.9 * 20_000 < result["valid_records"] < 20_000  # ~5% are failed candidates
    assert result["pairs_sampled"] > 0


def test_kept_splits_never_move_a_workload_as_the_search_grows():
    ids = [f"w{i}" for i in range(200)]
    by_rank = dataset.assign_splits(ids[:100], 0.1, 0.1, 0)
    # by rank, a grown search moves some of the first 100 across splits
    grown = dataset.assign_splits(ids, 0.1, 0.1, 0)
    assert any(grown[w] != by_rank[w] for w in ids[:100])
    # kept: the recorded 100 stand, the others follow their own hash whatever else is there
    kept = dataset.assign_splits(ids, 0.1, 0.1, 0, frozen=by_rank)
    assert all(kept[w] == by_rank[w] for w in ids[:100])
    alone = {w: dataset.assign_splits([w], 0.1, 0.1, 0, frozen={})[w] for w in ids[100:]}
    assert all(kept[w] == alone[w] for w in ids[100:])
    assert 5 <= sum(s != "train" for s in alone.values()) <= 40       # ~20% of 100 held out


def test_the_stage_writes_its_split_once_then_keeps_it(search_dir, tmp_path):
    path = tmp_path / "splits.json"
    p = from_dict(dataset.DataParams, dict(search_dir=str(search_dir), val_fraction=0.34, test_fraction=0.34,
                                           splits_file=str(path)))
    rows, stats = dataset.build_examples(p, progress=False)
    written = json.loads(path.read_text())
    assert written == {r["workload"]: r["split"] for r in rows} and stats["splits_kept"] == len(written)
    flipped = {w: ("train" if s != "train" else "test") for w, s in written.items()}
    path.write_text(json.dumps(flipped))
    rows, _ = dataset.build_examples(p, progress=False)
    assert {r["workload"]: r["split"] for r in rows} == flipped
    # the cost model leaves out what the kept split holds out, not what the rank would
    from pipeline.cost_model import training_split_exclusions
    assert training_split_exclusions(p) == {w for w, s in flipped.items() if s != "train"}
    path.write_text(json.dumps({"w": "holdout"}))
    with pytest.raises(ValueError, match="train, val or test"):
        dataset.build_examples(p, progress=False)
