"""Benchmark: guided decoding for the CUDA target, checked up to nvcc compilation on this
GPU-less machine (decode, apply, postprocess, build, nvcc -> cubin).

    python -m pipeline.bench.guided_cuda [--model models/sft] [--attempts 4] [--out reports/guided_cuda.json]

Every te_workload kernel with a CUDA design space, configs 0 and 1 (C3D:0 has no valid CUDA
point: 14,292 MetaSchedule samples all failed VerifyGPUCode, GPU.md; it is listed, left out).
The model is the CPU default's (trained on LLVM scripts; CUDA prompts say `target: cuda`), so
the guided figures measure the decoder's guarantee, and the free ones the model's own validity.
"""

from __future__ import annotations

import argparse
import time

NAMES = ["C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG"]
LEFT_OUT = {"C3D:0": "no valid CUDA point in practice (GPU.md: 14,292 samples failed VerifyGPUCode)"}


def run(model_dir: str, attempts: int, max_new_tokens: int, free: bool, retries: int = 2) -> dict:
    from pipeline import models
    from pipeline.describe import describe
    from pipeline.generate import GenerationParams, generate
    from pipeline.prompts import construction_prompt
    from pipeline.stages.evaluate import te_module
    from pipeline.verify import STAGES, Checker

    target_spec = "nvidia/nvidia-h100"
    target = make_target(target_spec)
    model, tok = models.load(model_dir)
    checker = Checker(timeout_s=300, workers=2)
    out = {"model": model_dir, "target": target_spec, "attempts": attempts, "retries_allowed": retries,
           "left_out": LEFT_OUT, "kernels": []}
    totals = {m: {s: 0 for s in STAGES} for m in ("guided", "free")}
    extra = {"guided": {"complete": 0, "retries": 0, "seconds": 0.0}, "free": {"complete": 0, "retries": 0, "seconds": 0.0}}
    for name in NAMES:
        for idx in (0, 1):
            item = f"{name}:{idx}"
            if item in LEFT_OUT:
                continue
            mod = te_module(item)
            prompt = construction_prompt(describe(mod), target.kind.name)
            row = {"kernel": item}
            for mode in (("guided", "free") if free else ("guided",)):
                g = GenerationParams(attempts=attempts, max_new_tokens=max_new_tokens, guided=mode == "guided",
                                     retries=retries)
                start = time.perf_counter()
                w = generate(model, tok, [prompt], g, kernels=[(mod, target)])
                outs = checker.compile_many(mod, w.scripts[0], target_spec)
                if mode == "guided":
                    outs = [o if c else type(o)("decode", "incomplete") for o, c in zip(outs, w.complete[0])]
                for o in outs:
                    totals[mode][o.stage] += 1
                extra[mode]["complete"] += sum(bool(c) for c in w.complete[0])
                extra[mode]["retries"] += w.retries
                extra[mode]["seconds"] += time.perf_counter() - start
                row[mode] = {"stages": [o.stage for o in outs], "errors": [o.error for o in outs if o.error][:2],
                             "retries": w.retries}
            out["kernels"].append(row)
            print(row, flush=True)
    for mode, counts in totals.items():
        n = sum(counts.values())
        if n:
            out[mode] = {"correctness": counts["ok"] / n, "attempts": n, "failures_by_stage": counts,
                         **{k: round(v, 1) if isinstance(v, float) else v for k, v in extra[mode].items()}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/sft")
    ap.add_argument("--attempts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=1600)
    ap.add_argument("--no-free", action="store_true", help="guided only")
    ap.add_argument("--retries", type=int, default=2, help="rewrites of a script a postprocessor rejects")
    ap.add_argument("--out", default="reports/guided_cuda.json")
    args = ap.parse_args()
    from pipeline import files

    result = run(args.model, args.attempts, args.max_new_tokens, not args.no_free, args.retries)
    files.write_json(args.out, result)
    print(f"guided CUDA correctness up to nvcc {result['guided']['correctness']:.3f} "
          f"({result['guided']['complete']}/{result['guided']['attempts']} complete, {result['guided']['retries']} "
          f"retries) -> {args.out}")


if __name__ == "__main__":
    main()
