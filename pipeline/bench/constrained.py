"""Benchmark: line-level constrained decoding vs free sampling, with the trained SFT model,
on validation prompts. Per-attempt correctness (the full verifier: decode, apply, postproc,
build, run, numerics) and generation wall time, both modes on the same prompts.

    python -m pipeline.bench.constrained [--prompts 3] [--out reports/constrained.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml


def run(params_path: str, n_prompts: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline import files, params as P, records
    from pipeline.stages import sft as train_sft
    from pipeline.generate import GenerationParams, generate, generate_constrained
    from pipeline.tvm_env import make_target
    from pipeline.verify import Checker
    from pipeline.workloads import Spec, build

    raw = yaml.safe_load(Path(params_path).read_text())
    p = P.from_dict(train_sft.SFTParams, raw["sft"], "sft")
    model = AutoModelForCausalLM.from_pretrained(p.output_dir)
    tok = AutoTokenizer.from_pretrained(p.output_dir)
    val = list(files.read_jsonl(Path(p.dataset_dir) / "val.jsonl"))
    specs = records.workload_entries(raw["data"]["search_dir"])
    target_spec = raw["search"]["target"]
    target = make_target(target_spec)
    g = P.from_dict(GenerationParams, p.generation, "sft.generation")
    checker = Checker(timeout_s=p.check_timeout_s)
    out = {}
    for task, rows in train_sft.eval_prompts(val, n_prompts, p.seed).items():
        for mode in ("constrained", "free"):
            counts: dict[str, int] = {}
            lines = []
            start = time.perf_counter()
            for r in rows:
                mod = build(Spec.from_json(specs[r["workload"]]))
                scripts = (generate_constrained(model, tok, r["prompt"], g, mod, target) if mode == "constrained"
                           else generate(model, tok, [r["prompt"]], g)[0])
                for text in scripts:
                    lines.append(len(text.splitlines()))
                    stage = checker.check(mod, text, target_spec).stage
                    counts[stage] = counts.get(stage, 0) + 1
            attempts = sum(counts.values())
            out[f"{task}.{mode}"] = {"prompts": len(rows), "attempts": attempts,
                                     "correctness": counts.get("ok", 0) / attempts if attempts else None,
                                     "stages": counts, "mean_script_lines": sum(lines) / len(lines) if lines else 0,
                                     "seconds_generate_and_check": round(time.perf_counter() - start, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--out", default="reports/constrained.json")
    a = ap.parse_args()
    result = run(a.params, a.prompts)
    from pipeline import files

    files.write_json(a.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
