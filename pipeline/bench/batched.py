"""Benchmark: guided generation one prompt at a time against several kernels' prompts batched.

    python -m pipeline.bench.batched [--model models/gpu/sft] [--params profiles/gpu.yaml] \
        [--te C1D:0 GMM:0 ...] [--rows 4 128] [--unmerged] [--profile prof.txt] [--out reports/bench_batched.json]

The same construction prompts (te_workload kernels on the params' search target), K guided
scripts each, written with `batch_rows` = each value of --rows (K = one prompt a batch, as
the evaluation wrote until session 11). Reported per setting: wall time, tokens per second,
time spent making masks, complete scripts; scripts are not checked here (guided scripts are
valid by construction; the evaluation checks them). On a GPU the model runs there.
`--unmerged` (a LoRA adapter): each setting also with the adapter kept apart from its base, as
the loader gave it before it merged adapters for inference (same seed, same scripts expected).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path


def run(model_dir: str, params_path: str, te: list[str], rows: list[int], unmerged: bool = False,
        profile: str | None = None, out_path: str | None = None) -> dict:
    import torch
    import yaml

    from pipeline import models, params as P
    from pipeline.describe import describe
    from pipeline.generate import GenerationParams, generate
    from pipeline.prompts import construction_prompt
    from pipeline.stages.evaluate import te_module
    from pipeline.tvm_env import make_target

    raw = yaml.safe_load(Path(params_path).read_text())
    g = P.from_dict(GenerationParams, raw["sft"]["generation"], "sft.generation")
    target = make_target(raw["search"]["target"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = {}
    for merge in [True] + ([False] if unmerged and models.is_adapter(model_dir) else []):
        model, tok = models.load(model_dir, merge=merge)
        loaded["merged" if merge else "kept"] = model.to(device) if device == "cuda" else model.float()
    mods = [te_module(item) for item in te]
    prompts = [construction_prompt(describe(m), target.kind.name) for m in mods]
    kernels = [(m, target) for m in mods]
    # warm-up: every prompt once with each model, untimed (on the H200 an 8-token warm-up left the first
    # timed run at 79 s against 23-24 s for the same run after it: reports/bench_batched_merge_h200.json)
    for model in loaded.values():
        generate(model, tok, prompts, dataclasses.replace(g, attempts=1, batch_rows=rows[0]), kernels=kernels)
    out = {"model": model_dir, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
           "target": raw["search"]["target"], "kernels": te, "attempts": g.attempts, "runs": []}
    for r in rows:
        for adapter, model in loaded.items():
            w = generate(model, tok, prompts, dataclasses.replace(g, batch_rows=r), seed=0, kernels=kernels)
            out["runs"].append(_figures(w, r, adapter if len(loaded) > 1 else None))
            print(out["runs"][-1], flush=True)
    first = out["runs"][0]["tokens_per_second"]
    for run_ in out["runs"]:
        run_["tokens_per_second_over_first"] = round(run_["tokens_per_second"] / first, 2)
    if out_path:
        from pipeline import files

        files.write_json(out_path, out)
    if profile:   # one more run, the first model at the last setting, under cProfile (its figures apart)
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        w = generate(next(iter(loaded.values())), tok, prompts, dataclasses.replace(g, batch_rows=rows[-1]), seed=0,
                     kernels=kernels)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(60)
        Path(profile).write_text(f"{_figures(w, rows[-1], None)}\n{text.getvalue()}")
    return out


def _figures(w, rows: int, adapter: str | None) -> dict:
    complete = [c for per in w.complete for c in per]
    return {"batch_rows": rows, **({"adapter": adapter} if adapter else {}), "seconds": round(w.seconds, 2),
            "tokens": w.tokens, "tokens_per_second": round(w.tokens / w.seconds, 1),
            "mask_seconds": round(w.mask_seconds, 2),
            "complete": sum(map(bool, complete)), "scripts": len(complete), "retries": w.retries}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/gpu/sft")
    ap.add_argument("--params", default="profiles/gpu.yaml")
    ap.add_argument("--te", nargs="+", default=["C1D:0", "C2D:0", "GMM:0", "GRP:0", "DEP:0", "T2D:0", "NRM:0", "SFM:0"])
    ap.add_argument("--rows", nargs="+", type=int, default=[4, 128], help="batch_rows settings, the first the reference")
    ap.add_argument("--unmerged", action="store_true", help="a LoRA adapter: also each setting with it kept apart")
    ap.add_argument("--profile", default=None, metavar="TXT",
                    help="also one run under cProfile, its 60 costliest calls written to TXT")
    ap.add_argument("--out", default="reports/bench_batched.json")
    args = ap.parse_args()
    result = run(args.model, args.params, args.te, args.rows, args.unmerged, args.profile, args.out)
    print(" ; ".join(f"batch_rows {x['batch_rows']}{' ' + x['adapter'] if 'adapter' in x else ''}: "
                     f"{x['tokens_per_second']} tokens/s "
                     f"({x['tokens_per_second_over_first']}x)" for x in result["runs"]) + f" -> {args.out}")


if __name__ == "__main__":
    main()
