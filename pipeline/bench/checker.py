"""Benchmark: the checker's own work per timed check (everything but the kernel's timing), on a
large workload, in one process: decode, build, run, compare with the reference, time.

The evaluation re-times every MetaSchedule candidate through this path; on a GPU the kernel
times in ~0.1 s, so the host work around it (inputs, copies, the comparison) is most of a check.

    python -m pipeline.bench.checker [--checks 3] [--out reports/bench_checker_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

# elementwise 768 x 11008: three arrays of 8.4M floats (a catalog shape)
SPEC = {"id": "elementwise-ee58ae9301", "family": "elementwise", "params": [768, 11008, 2], "dtype": "float32"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checks", type=int, default=3)
    ap.add_argument("--target", default='{"kind": "llvm", "num-cores": 2}', help="target spec (JSON or a tag)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "reports"), "bench_checker_cpu.json"))
    a = ap.parse_args()

    from pipeline import codec, measure, verify
    from pipeline.space import sample_many
    from pipeline.tvm_env import make_target
    from pipeline.workloads import Spec, build

    spec = json.loads(a.target) if a.target.startswith("{") else a.target
    target = make_target(spec)
    mod = build(Spec.from_json(SPEC))
    texts = [codec.encode(mod, s.trace, target) for s in sample_many(mod, target, a.checks + 1, seed=0)]
    timing = []

    def clocked(inner):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                timing.append(time.perf_counter() - start)
        return call

    for name in ("time_tensors", "time_executable"):   # the checker's timer (older checkers: time_executable)
        if hasattr(verify, name):
            setattr(verify, name, clocked(getattr(measure, name)))
    verify.check_in_process(mod, texts[0], target, timed=True)     # the reference, once per process
    timing.clear()
    start = time.perf_counter()
    stages = [verify.check_in_process(mod, t, target, timed=True).stage for t in texts[1:]]
    total = time.perf_counter() - start
    report = {"workload": SPEC, "target": spec, "checks": a.checks, "stages": stages,
              "seconds_per_check": round(total / a.checks, 3),
              "kernel_timing_s_per_check": round(sum(timing) / a.checks, 3),
              "checker_work_s_per_check": round((total - sum(timing)) / a.checks, 3)}
    print(report)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
