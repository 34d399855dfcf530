"""Stage 3: validate the training data with Great Expectations before any training.

    little-dragon validate

Runs an expectation suite over all examples (train, val, test) with a GX 1.x file context
under `reports/gx/`; writes the JSON result to `reports/validation.json` and Data Docs (HTML)
to `reports/data_docs/`. Any failed expectation stops the pipeline (exit status 1) with a
summary naming the expectation, the column and examples of bad rows.

Checks that are not column statistics (every script decodes and round-trips through the
codec, a workload in one split only) are computed into columns first, then expected.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline import codec, files, params as P, records
from pipeline.tvm_env import make_target
from pipeline.workloads import Spec, build

COLUMNS = ["workload", "family", "split", "target", "task", "prompt", "completion", "latency_s",
           "source_latency_s", "speedup_vs_source", "speedup_vs_baseline", "baseline_s"]


@dataclass
class ValidateParams:
    dataset_dir: str = "data/dataset"
    min_examples: int = 2000
    max_examples: int = 10_000_000
    roundtrip_sample: int = 0         # 0: check every script; else a deterministic sample
    gx_dir: str = "reports/gx"
    docs_dir: str = "reports/data_docs"
    report: str = "reports/validation.json"

    def __post_init__(self):
        P.require(0 < self.min_examples <= self.max_examples, "need 0 < min_examples <= max_examples")


class ValidationFailed(RuntimeError):
    """At least one expectation failed; the message lists which and where."""


def load_examples(dataset_dir: str):
    import pandas as pd

    frames = []
    for split in ("train", "val", "test"):
        path = Path(dataset_dir) / f"{split}.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"{path} missing: run `little-dragon data` first")
        frames.append(pd.read_json(path, lines=True, dtype=False))
    return pd.concat(frames, ignore_index=True)


def add_derived_columns(df, target_spec, specs: dict[str, dict], roundtrip_sample: int = 0):
    """`roundtrip_ok`: the completion (and a refinement prompt's script) decodes to a trace
    that encodes back to the same text; `splits_of_workload`: in how many splits it appears."""
    df = df.copy()
    df["splits_of_workload"] = df.groupby("workload")["split"].transform("nunique")
    target = make_target(target_spec)
    mods: dict[str, object] = {}
    ok = []
    rows = df.index if not roundtrip_sample else df.sample(min(roundtrip_sample, len(df)), random_state=0).index
    checked = set(rows)
    for i, row in df.iterrows():
        if i not in checked:
            ok.append(True)
            continue
        if row["workload"] not in mods:
            mods[row["workload"]] = build(Spec.from_json(specs[row["workload"]]))
        ok.append(_round_trips(mods[row["workload"]], row["completion"], target))
    df["roundtrip_ok"] = ok
    return df


def _round_trips(mod, text, target) -> bool:
    if not isinstance(text, str):
        return False
    try:
        return codec.round_trips(mod, codec.decode(mod, text, target), target, text)
    except codec.DecodeError:
        return False


def expectations(min_examples: int, max_examples: int, min_speedup: float) -> list:
    import great_expectations as gx

    E = gx.expectations
    out = [
        E.ExpectTableColumnsToMatchSet(column_set=COLUMNS + ["splits_of_workload", "roundtrip_ok"], exact_match=True),
        E.ExpectTableRowCountToBeBetween(min_value=min_examples, max_value=max_examples),
    ]
    for col in ("workload", "family", "split", "target", "task", "prompt", "completion", "latency_s"):
        out.append(E.ExpectColumnValuesToNotBeNull(column=col))
    out += [
        E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "val", "test"]),
        E.ExpectColumnValuesToBeInSet(column="task", value_set=["construction", "refinement"]),
        E.ExpectColumnValuesToBeOfType(column="prompt", type_="str"),
        E.ExpectColumnValuesToBeOfType(column="completion", type_="str"),
        E.ExpectColumnValuesToBeBetween(column="latency_s", min_value=0, strict_min=True, max_value=1e6),
        E.ExpectColumnValuesToBeBetween(column="baseline_s", min_value=0, strict_min=True, max_value=1e6),
        E.ExpectColumnValuesToBeInSet(column="roundtrip_ok", value_set=[True]),
        E.ExpectColumnValuesToBeInSet(column="splits_of_workload", value_set=[1]),
        E.ExpectCompoundColumnsToBeUnique(column_list=["prompt", "completion"]),
        E.ExpectColumnValuesToNotBeNull(column="speedup_vs_source", row_condition='task=="refinement"',
                                        condition_parser="pandas"),
        E.ExpectColumnValuesToBeBetween(column="speedup_vs_source", min_value=min_speedup, max_value=1e9,
                                        row_condition='task=="refinement"', condition_parser="pandas"),
        E.ExpectColumnValuesToBeBetween(column="source_latency_s", min_value=0, strict_min=True, max_value=1e6,
                                        row_condition='task=="refinement"', condition_parser="pandas"),
    ]
    return out


def run_validation(df, p: ValidateParams, min_speedup: float) -> dict:
    import great_expectations as gx

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    gx_dir = Path(p.gx_dir)
    shutil.rmtree(gx_dir, ignore_errors=True)
    gx_dir.mkdir(parents=True)
    context = gx.get_context(mode="file", project_root_dir=str(gx_dir))
    source = context.data_sources.add_pandas("little_dragon")
    batch_def = source.add_dataframe_asset("examples").add_batch_definition_whole_dataframe("all")
    suite = context.suites.add(gx.ExpectationSuite(name="training_examples"))
    for expectation in expectations(p.min_examples, p.max_examples, min_speedup):
        suite.add_expectation(expectation)
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name="training_examples", data=batch_def, suite=suite))
    checkpoint = context.checkpoints.add(gx.Checkpoint(
        name="before_training", validation_definitions=[definition],
        actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")], result_format="SUMMARY"))
    result = checkpoint.run(batch_parameters={"dataframe": df})
    described = result.describe_dict()
    _copy_docs(gx_dir, Path(p.docs_dir))
    return described


def _copy_docs(gx_dir: Path, docs_dir: Path) -> None:
    sites = list(gx_dir.rglob("local_site"))
    if sites:
        shutil.rmtree(docs_dir, ignore_errors=True)
        shutil.copytree(sites[0], docs_dir)


def failures(described: dict) -> list[str]:
    """Readable lines: which expectation failed, on which column, with example bad values."""
    lines = []
    for run in described.get("validation_results", []):
        for exp in run.get("expectations", []):
            if exp.get("success"):
                continue
            kwargs = exp.get("kwargs", {})
            where = kwargs.get("column") or kwargs.get("column_list") or "table"
            res = exp.get("result", {}) or {}
            sample = res.get("partial_unexpected_list") or res.get("observed_value")
            count = res.get("unexpected_count")
            lines.append(f"{exp.get('expectation_type')} on {where}: "
                         f"{count if count is not None else ''} unexpected; e.g. {str(sample)[:200]}")
    return lines


def main(params_path: str = "params.yaml") -> dict:
    p = P.load("validate", ValidateParams, params_path)
    raw = yaml.safe_load(Path(params_path).read_text())
    specs = records.workload_entries(raw["data"]["search_dir"])
    df = add_derived_columns(load_examples(p.dataset_dir), raw["search"]["target"], specs, p.roundtrip_sample)
    described = run_validation(df, p, float(raw["data"]["min_speedup"]))
    bad = failures(described)
    checked = min(p.roundtrip_sample, len(df)) if p.roundtrip_sample else len(df)
    report = {"success": not bad, "examples": len(df), "failed_expectations": bad,
              "roundtrip": {"checked": checked, "sampled": checked < len(df)},   # decode + re-encode per script
              "statistics": described.get("validation_results", [{}])[0].get("statistics")}
    files.write_json(p.report, report)
    if bad:
        raise ValidationFailed("data validation failed:\n  " + "\n  ".join(bad) + f"\n(details: {p.report}, {p.docs_dir}/index.html)")
    print(f"validate: {len(df)} examples, all expectations met -> {p.report}, {p.docs_dir}/index.html")
    return report
