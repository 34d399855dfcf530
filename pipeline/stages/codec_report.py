"""Compactness of the script language, against TVM's `Trace.as_python()` and `as_json()`.

    little-dragon codec-report     # writes reports/codec.json

Traces: random postprocessed samples from the design spaces of `workloads_per_family`
workloads of every catalog family, on each target in params.yaml. Every trace is also
checked to round-trip exactly. Token counts use (a) the project's tokenizer, trained on the
scripts, and (b) a neutral byte-level BPE trained on all three forms together, so that no
form is favoured by the tokenizer's training data.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from tqdm import tqdm

from pipeline import codec, files, params as P
from pipeline.space import SpaceError, sample_many
from pipeline.tokenizer import train_tokenizer
from pipeline.tvm_env import make_target
from pipeline.workloads import FAMILIES, build, catalog


@dataclass
class CodecReportParams:
    targets: list = field(default_factory=lambda: [{"kind": "llvm", "num-cores": 2}, "nvidia/nvidia-h100"])
    workloads_per_family: int = 2
    samples_per_workload: int = 3
    seed: int = 0
    vocab_size: int = 2048
    report: str = "reports/codec.json"

    def __post_init__(self):
        P.require(self.workloads_per_family > 0 and self.samples_per_workload > 0, "counts must be > 0")


def collect(p: CodecReportParams, progress: bool = True) -> list[dict]:
    specs = catalog(p.seed)
    rows = []
    jobs = [(t, s) for t in p.targets for fam in sorted(FAMILIES)
            for s in [x for x in specs if x.family == fam][: p.workloads_per_family]]
    for target_spec, spec in tqdm(jobs, desc="codec report", disable=not progress):
        target = make_target(target_spec)
        mod = build(spec)
        try:
            schedules = sample_many(mod, target, p.samples_per_workload, seed=p.seed)
        except SpaceError:
            continue
        for sch in schedules:
            trace = sch.trace
            text = codec.encode(mod, trace, target)
            rows.append({
                "workload": spec.id, "family": spec.family, "target": target.kind.name,
                "script": text, "python": "\n".join(trace.as_python()),
                "json": json.dumps(codec.trace_to_json(trace), separators=(",", ":")),
                "exact": codec.round_trips(mod, trace, target, text),
                "generic_lines": sum(1 for ln in text.split("\n") if ln.startswith("!")),
            })
    return rows


def summarize(rows: list[dict], vocab_size: int) -> dict:
    project = train_tokenizer((r["script"] for r in rows), vocab_size)
    neutral = train_tokenizer([r[k] for r in rows for k in ("script", "python", "json")], vocab_size)
    out = {"traces": len(rows), "exact_round_trips": sum(r["exact"] for r in rows),
           "traces_with_generic_lines": sum(1 for r in rows if r["generic_lines"])}
    for form in ("script", "python", "json"):
        texts = [r[form] for r in rows]
        out[form] = {
            "mean_chars": statistics.mean(len(t) for t in texts),
            "mean_tokens_project_tokenizer": statistics.mean(len(project(t)["input_ids"]) for t in texts),
            "mean_tokens_neutral_tokenizer": statistics.mean(len(neutral(t)["input_ids"]) for t in texts),
        }
    for base in ("python", "json"):
        out[f"ratio_to_{base}"] = {
            k: out["script"][k] / out[base][k] for k in out["script"]}
    by_target = {}
    for tgt in sorted({r["target"] for r in rows}):
        sel = [r for r in rows if r["target"] == tgt]
        by_target[tgt] = {"traces": len(sel),
                          "chars_ratio_to_python": statistics.mean(len(r["script"]) for r in sel)
                          / statistics.mean(len(r["python"]) for r in sel)}
    out["by_target"] = by_target
    plain = [r for r in rows if not r["generic_lines"]]
    if plain:
        out["chars_ratio_to_python_without_generic_lines"] = (
            statistics.mean(len(r["script"]) for r in plain) / statistics.mean(len(r["python"]) for r in plain))
    return out


def main(params_path: str = "params.yaml") -> dict:
    p = P.load("codec_report", CodecReportParams, params_path)
    rows = collect(p)
    report = summarize(rows, p.vocab_size)
    files.write_json(p.report, report)
    print(f"codec: {report['traces']} traces, {report['exact_round_trips']} exact round trips; "
          f"script/as_python = {report['ratio_to_python']['mean_chars']:.3f} in chars, "
          f"{report['ratio_to_python']['mean_tokens_neutral_tokenizer']:.3f} in neutral tokens -> {p.report}")
    return report
