"""Benchmark: guided decoding against free sampling, with a trained model, on the same prompts.

    python -m pipeline.bench.guided [--model models/sft] [--prompts 4] [--out reports/guided.json]

For each prompt (validation and test construction/refinement prompts, and te_workload kernels):
K scripts guided and K sampled freely, each checked by the project's checker (decode, apply,
postprocess, build, run, compare; untimed). Time: the guided run's wall time against free
sampling of *the same number of tokens* (same batch, min_new_tokens = max_new_tokens = the
guided scripts' mean length), so the ratio is the cost of the masks, not of script length.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def run(model_dir: str, n_prompts: int, te: list[str], params_path: str = "params.yaml") -> dict:
    import torch
    import yaml

    from pipeline import files, models, params as P, records
    from pipeline.describe import describe
    from pipeline.generate import GenerationParams, _sample, generate
    from pipeline.prompts import construction_prompt
    from pipeline.stages.evaluate import te_module
    from pipeline.tvm_env import make_target
    from pipeline.verify import STAGES, Checker
    from pipeline.workloads import Spec, build

    raw = yaml.safe_load(Path(params_path).read_text())
    g = P.from_dict(GenerationParams, raw["sft"]["generation"], "sft.generation")
    target_spec = raw["search"]["target"]
    target = make_target(target_spec)
    specs = records.workload_entries(raw["data"]["search_dir"])
    model, tok = models.load(model_dir)
    rows = [r for split in ("val", "test") for r in files.read_jsonl(Path(raw["data"]["output_dir"]) / f"{split}.jsonl")]
    prompts, seen = [], set()
    for task in ("construction", "refinement"):
        for r in rows:
            if r["task"] == task and r["prompt"] not in seen and sum(p[2] == task for p in prompts) < n_prompts:
                seen.add(r["prompt"])
                prompts.append((r["prompt"], build(Spec.from_json(specs[r["workload"]])), task, r["workload"]))
    for item in te:
        mod = te_module(item)
        prompts.append((construction_prompt(describe(mod), target.kind.name), mod, "te_workload", item))
    checker = Checker(timeout_s=120, workers=2)
    out = {"model": model_dir, "attempts": g.attempts, "prompts": [], "totals": {}}
    tot = {m: {"ok": 0, "n": 0, "seconds": 0.0, "tokens": 0, "complete": 0} for m in ("guided", "free", "free_same_tokens")}
    stages = {m: {s: 0 for s in STAGES} for m in ("guided", "free")}
    for prompt, mod, task, name in prompts:
        row = {"task": task, "workload": name}
        for mode in ("guided", "free"):
            gm = GenerationParams(**{**g.__dict__, "guided": mode == "guided"})
            w = generate(model, tok, [prompt], gm, seed=0, kernels=[(mod, target)])
            outs = checker.check_many(mod, w.scripts[0], target_spec)
            if mode == "guided":   # an incomplete guided script is a failure, never a short correct one
                outs = [o if c else type(o)("decode", "incomplete") for o, c in zip(outs, w.complete[0])]
            for o in outs:
                stages[mode][o.stage] += 1
            t = tot[mode]
            t["ok"] += sum(o.correct for o in outs)
            t["n"] += len(outs)
            t["seconds"] += w.seconds
            t["tokens"] += w.tokens
            t["complete"] += sum(bool(c) for c in w.complete[0])
            row[mode] = {"correct": sum(o.correct for o in outs), "attempts": len(outs), "seconds": round(w.seconds, 2),
                         "tokens": w.tokens, "retries": w.retries, "mask_seconds": round(w.mask_seconds, 2),
                         "stages": [o.stage for o in outs]}
            if mode == "guided":
                # free sampling of exactly as many tokens, same batch
                n = max(1, round(w.tokens / g.attempts))
                torch.manual_seed(0)
                start = time.perf_counter()
                same = GenerationParams(**{**g.__dict__, "guided": False, "max_new_tokens": n})
                with torch.no_grad():
                    _sample(model, tok, [prompt] * g.attempts, same, min_new_tokens=n)
                secs = time.perf_counter() - start
                tot["free_same_tokens"]["seconds"] += secs
                tot["free_same_tokens"]["tokens"] += n * g.attempts
                row["free_same_tokens_seconds"] = round(secs, 2)
        out["prompts"].append(row)
        print(json.dumps(row), flush=True)
    for m, t in tot.items():
        out["totals"][m] = {**t, "correctness": t["ok"] / t["n"] if t["n"] else None,
                            "tokens_per_second": round(t["tokens"] / t["seconds"], 1) if t["seconds"] else None}
    out["stages"] = stages
    out["guided_time_over_free_same_tokens"] = (tot["guided"]["seconds"] / tot["free_same_tokens"]["seconds"]
                                                if tot["free_same_tokens"]["seconds"] else None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/sft")
    ap.add_argument("--prompts", type=int, default=4, help="construction and refinement prompts each")
    ap.add_argument("--te", nargs="*", default=["GMM:0", "C2D:1", "SFM:0", "NRM:0", "DEP:1", "TBG:0"])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default="reports/guided.json")
    args = ap.parse_args()
    from pipeline import files

    result = run(args.model, args.prompts, args.te, args.params)
    files.write_json(args.out, result)
    t = result["totals"]
    print(f"guided correctness {t['guided']['correctness']:.3f} ({t['guided']['complete']}/{t['guided']['n']} complete), "
          f"free {t['free']['correctness']:.3f}; guided time / free same tokens "
          f"{result['guided_time_over_free_same_tokens']:.2f} -> {args.out}")


if __name__ == "__main__":
    main()
