"""Benchmark: does the CPU machine's compile check (decode, apply, postprocess, TVM build, nvcc
-> cubin; pipeline.verify.compile_check) predict what the H200 made of the same scripts?

    python -m pipeline.bench.compile_check [--archive databases/evaluate-gpu] [--search-dir data/search-gpu] \
        [--workers 2] [--out reports/gpu/compile_check.json]

Reads the GPU evaluation's archive (every model's construction scripts with the outcome the
H200 checker gave them), compiles each script again here, and counts the agreement: a script
that failed to build there should fail here (caught), one that built there should compile here
(no false alarm). Where it agrees, the check can drop a candidate before a GPU measures it.
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from pathlib import Path


def modules(archive: Path, search_dir: str) -> dict:
    """Task key -> a function that builds its module (te_workload, held-out catalog, test workload)."""
    from pipeline import records
    from pipeline.stages.evaluate import te_module
    from pipeline.workloads import Spec, build

    specs = {s["id"]: Spec.from_json(s) for s in json.loads((archive / "heldout.json").read_text())["value"]}
    specs.update({k: Spec.from_json(v) for k, v in records.workload_entries(Path(search_dir)).items()})

    def make(key: str):
        if key.startswith("te_"):
            name, idx = key[3:].rsplit("_", 1)
            return te_module(f"{name}:{idx}")
        return build(specs[key])

    return make


def run(archive: Path, search_dir: str, workers: int, fields: list[str] | None) -> dict:
    from tqdm import tqdm

    from pipeline.tvm_env import make_target
    from pipeline.verify import Checker

    target_spec = "nvidia/nvidia-h100"
    make_target(target_spec)
    make = modules(archive, search_dir)
    checker = Checker(timeout_s=300, workers=workers)
    per_field: dict = {}
    errors: dict = {}
    files = sorted(glob.glob(str(archive / "tasks" / "*.json")))
    start = time.perf_counter()
    for path in tqdm(files, desc="tasks"):
        key = Path(path).stem
        kept = json.loads(Path(path).read_text())
        todo = [(f, v["result"]) for f, v in kept.items() if f.startswith("model:") and (fields is None or f in fields)]
        if not todo:
            continue
        mod = make(key)
        for field, result in todo:
            texts = result["scripts"]
            there = [o["stage"] for o in result["construction"]]
            here = checker.compile_many(mod, texts, target_spec)
            c = per_field.setdefault(field, {"scripts": 0, "gpu_build_failed": 0, "caught": 0, "gpu_ok": 0,
                                             "false_alarms": 0, "stages_here": {}})
            for t, h in zip(there, here):
                c["scripts"] += 1
                c["stages_here"][h.stage] = c["stages_here"].get(h.stage, 0) + 1
                if t == "build":
                    c["gpu_build_failed"] += 1
                    c["caught"] += h.stage != "ok"
                elif t == "ok":
                    c["gpu_ok"] += 1
                    if h.stage != "ok":
                        c["false_alarms"] += 1
                        errors.setdefault(field, []).append({"task": key, "here": h.stage, "error": h.error})
    seconds = time.perf_counter() - start
    checker.close()
    n = sum(c["scripts"] for c in per_field.values())
    failed = sum(c["gpu_build_failed"] for c in per_field.values())
    ok = sum(c["gpu_ok"] for c in per_field.values())
    return {"archive": str(archive), "target": target_spec, "workers": workers, "scripts": n,
            "seconds": round(seconds, 1), "seconds_per_script_per_worker": round(seconds * workers / n, 2) if n else None,
            "gpu_build_failed": failed, "caught": sum(c["caught"] for c in per_field.values()),
            "gpu_ok": ok, "false_alarms": sum(c["false_alarms"] for c in per_field.values()),
            "per_field": per_field, "false_alarm_errors": errors}


def main() -> None:
    from pipeline import files

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", default="databases/evaluate-gpu")
    ap.add_argument("--search-dir", default="data/search-gpu", help="the GPU search records (test workloads' specs)")
    ap.add_argument("--fields", nargs="*", help="model fields of the archive (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="reports/gpu/compile_check.json")
    args = ap.parse_args()
    out = run(Path(args.archive), args.search_dir, args.workers, args.fields)
    files.write_json(args.out, out)
    print(f"compile check here vs the H200: {out['caught']}/{out['gpu_build_failed']} build failures caught, "
          f"{out['false_alarms']}/{out['gpu_ok']} false alarms, {out['seconds_per_script_per_worker']} s a script "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
