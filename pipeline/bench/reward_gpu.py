"""Benchmark on a GPU: the RL reward's measurement path (pipeline.reward) on real CUDA kernels.

For a few small catalog workloads, scripts sampled from the CUDA design space go through the
Measurer exactly as in RL/evaluation: decode, apply, postprocess, build (parallel workers),
run, allclose against the DLight default schedule, time (runs take turns on the GPU). Also a
script that breaks the GPU thread limit (postproc), and garbage (decode). Reports the stage
counts, speedups over DLight, the shaped rewards, the seconds per check, and that a second
pass is served from the cache.

    python -m pipeline.bench.reward_gpu [--samples 8] [--workloads 4] [--out reports/reward_h200.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from dataclasses import asdict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--workloads", type=int, default=4)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "reports"), "reward_h200.json"))
    a = ap.parse_args()

    from pipeline import codec
    from pipeline.params import from_dict
    from pipeline.reward import Measurer, RewardParams, score
    from pipeline.stages.search import SearchParams, select_workloads
    from pipeline.space import sample_many
    from pipeline.tvm_env import make_target

    target_spec = "nvidia/nvidia-h100"
    target = make_target(target_spec)
    sp = from_dict(SearchParams, {"target": target_spec, "num_workloads": a.workloads, "trials_per_workload": 1, "trials_per_iter": 1,
                                  "families": ["matmul", "softmax", "layer_norm", "conv2d_bias_relu"],
                                  "max_mflop": 500, "max_elements": 5_000_000})
    specs = select_workloads(sp)
    measurer = Measurer({s.id: s.to_json() for s in specs}, target_spec, timeout_s=120, workers=a.workers)
    rp = RewardParams()
    rows, pairs = [], []
    for spec in specs:
        mod = measurer.module(spec.id)
        scripts = [codec.encode(mod, s.trace, target) for s in sample_many(mod, target, a.samples, seed=1)]
        pairs += [(spec.id, s) for s in scripts] + [(spec.id, "garbage here")]
    start = time.perf_counter()
    outcomes = measurer.measure(pairs)
    first = time.perf_counter() - start
    start = time.perf_counter()
    measurer.measure(pairs)
    second = time.perf_counter() - start
    for (w, s), o in zip(pairs, outcomes):
        sc = score(o, None, rp)
        rows.append({"workload": w, "lines": s.count("\n") + 1, **asdict(o), "reward": sc.total})
    ok = [r for r in rows if r["stage"] == "ok"]
    speedups = sorted(r["latency_s"] and r["baseline_s"] / r["latency_s"] for r in ok)
    result = {"device": "NVIDIA H200", "target": target_spec, "workloads": [s.id for s in specs],
              "checks": len(pairs), "stages": dict(Counter(r["stage"] for r in rows)),
              "seconds_first_pass": round(first, 1), "seconds_per_check": round(first / len(pairs), 2),
              "seconds_second_pass_cached": round(second, 3), "builds": measurer.builds,
              "speedup_vs_dlight": {"min": speedups[0] if speedups else None,
                                    "median": speedups[len(speedups) // 2] if speedups else None,
                                    "max": speedups[-1] if speedups else None},
              "rewards_by_stage": {st: sorted({round(r["reward"], 3) for r in rows if r["stage"] == st})[:6]
                                   for st in {r["stage"] for r in rows}},
              "rows": rows}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
