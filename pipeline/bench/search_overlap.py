"""Benchmark: a CUDA search's throughput in turns (MetaSchedule's way) and overlapped
(pipeline/overlap.py), on a machine without a GPU: the CPU side real, the GPU stood in for.

    CUDA_PATH=/usr/local/cuda python -m pipeline.bench.search_overlap --params profiles/gpu.yaml \
        [--workloads 4] [--trials 32] [--run-ms 300] [--repeats 1] [--out reports/bench_search_overlap_cpu.json]

Real: the CUDA target (nvidia/nvidia-h100), the search stage's first workloads and settings
(evolutionary search, population, ReplayFirst, trials per round), the kept build workers, and
every build compiled by NVRTC as TVM compiles it on the H200 (its runs record
cuda_compile_mode nvrtc). Without a GPU, `tvm.compile` keeps CUDA source uncompiled (GPU.md), so
the build function here compiles it: this needs the `cuda-bindings` and `nvidia-cuda-nvrtc`
wheels (not project dependencies), their libnvrtc on LD_LIBRARY_PATH, and CUDA_PATH for headers.
Stood in: the GPU measurement, a runner taking `--run-ms` of wall time per candidate without
using the CPU and answering a random latency (the strategy and cost model work on it as on
real ones; what they find means nothing). Default 300 ms: GPU.md's H200 rounds of 32 small
te_workload candidates took 7-11 s to measure (0.22-0.34 s each).
On a GPU machine, measure for real: python -m pipeline.bench.search --variants persistent overlap.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import tempfile
import threading
import time

from pipeline.tvm_env import ms, tvm


def nvrtc_build(mod, target, params):
    """In a build worker: MetaSchedule's default build, then the NVRTC compile that the build
    does by itself where a GPU is."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build
    from tvm.support import nvcc

    built = default_build(mod, target, params)
    module = built.mod if hasattr(built, "mod") else built
    with target:
        nvcc.compile_cuda(module.imports[0].inspect_source(), target_format="cubin", compiler="nvrtc")
    return built


@tvm.ir.utils.derived_object
class _StandInFuture(ms.runner.PyRunnerFuture):
    def __init__(self, ready: threading.Event, latency_s: float) -> None:
        super().__init__()
        self.ready, self.latency_s = ready, latency_s

    def done(self) -> bool:
        return self.ready.is_set()

    def result(self):
        self.ready.wait()
        return ms.runner.RunnerResult([self.latency_s], None)


@tvm.ir.utils.derived_object
class StandInGPU(ms.runner.PyRunner):
    """`run_ms` of wall time per candidate, one candidate at a time, and done when that has
    passed: synchronous like TVM's LocalRunner (which measures inside `run`)."""

    def __init__(self, run_ms: float, seed: int = 0) -> None:
        super().__init__()
        self.run_ms, self.rng, self.lock = run_ms, random.Random(seed), threading.Lock()

    def run(self, runner_inputs):
        with self.lock:    # one GPU: measurements never overlap
            time.sleep(self.run_ms / 1000 * len(runner_inputs))
            done = threading.Event()
            done.set()
            return [_StandInFuture(done, self.rng.uniform(1e-5, 1e-3)) for _ in runner_inputs]


def check_nvrtc() -> None:
    """Fail at once, in one line, where NVRTC cannot compile (rather than after a search)."""
    from tvm.support import nvcc

    try:
        with tvm.target.Target("nvidia/nvidia-h100"):
            nvcc.compile_cuda("extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }",
                              target_format="cubin", compiler="nvrtc")
    except (RuntimeError, ImportError, OSError) as err:
        raise SystemExit(f"NVRTC cannot compile here ({str(err).strip().splitlines()[0]}); install the "
                         "cuda-bindings and nvidia-cuda-nvrtc wheels, put their libnvrtc on LD_LIBRARY_PATH "
                         "and set CUDA_PATH") from None


def run(params_path: str, workloads: int, trials: int, run_ms: float, repeats: int, out_path: str | None,
        builder_workers: int | None = None) -> dict:
    from pipeline import files, params as P, tuning
    from pipeline.bench.search import machine
    from pipeline.overlap import OverlapBuilder
    from pipeline.stages.search import SearchParams, select_workloads
    from pipeline.workloads import build

    check_nvrtc()
    base = P.load("search", SearchParams, params_path)
    workers = builder_workers or min(base.builder_workers, len(os.sched_getaffinity(0)))
    p = dataclasses.replace(base, num_workloads=workloads, trials_per_workload=trials,
                            trials_per_iter=min(base.trials_per_iter, trials), builder_workers=workers)
    specs = select_workloads(p)
    target = tvm.target.Target(p.target)
    out = {"machine": machine(), "params": params_path, "target": str(target.export().get("tag") or target),
           "workloads": [s.id for s in specs], "trials_per_workload": trials,
           "trials_per_iter": p.trials_per_iter, "population_size": p.population_size,
           "genetic_num_iters": p.genetic_num_iters, "first_round": p.first_round,
           "builder_workers": p.builder_workers, "stand_in_run_ms": run_ms, "runs": []}
    for rep in range(repeats):
        for overlap in (False, True):        # alternated, so drift in the machine hits both
            kind = OverlapBuilder if overlap else tuning.PoolBuilder
            pool = kind(p.builder_workers, p.build_timeout_s, tuning.Phases(), f_build=nvrtc_build)
            with tempfile.TemporaryDirectory() as tmp:
                phases = tuning.tune(p, target, [(s.id, build(s)) for s in specs], tmp, trials, p.trials_per_iter,
                                     logger="bench", pool=pool, overlap=overlap, runner=StandInGPU(run_ms, seed=rep))
                db = ms.database.JSONDatabase(work_dir=tmp)
                measured = len(db)
            pool.shutdown()
            row = {"variant": "overlap" if overlap else "in_turns", "repeat": rep, "measured": measured,
                   **phases.to_json(),
                   "candidates_per_min": round(60 * measured / phases.seconds, 1)}
            out["runs"].append(row)
            print(row, flush=True)
            if out_path:
                files.write_json(out_path, out)
    by = {v: [r["candidates_per_min"] for r in out["runs"] if r["variant"] == v] for v in ("in_turns", "overlap")}
    out["summary"] = {v: round(sum(x) / len(x), 1) for v, x in by.items()}
    out["summary"]["ratio"] = round(out["summary"]["overlap"] / out["summary"]["in_turns"], 2)
    print(out["summary"])
    if out_path:
        files.write_json(out_path, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="profiles/gpu.yaml")
    ap.add_argument("--workloads", type=int, default=4)
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--run-ms", type=float, default=300.0, help="stand-in GPU time per candidate")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--builder-workers", type=int, default=None, help="default: the profile's, capped by the cores")
    ap.add_argument("--out", default="reports/bench_search_overlap_cpu.json")
    args = ap.parse_args()
    if args.workloads < 1 or args.trials < 1 or args.run_ms < 0 or args.repeats < 1:
        raise SystemExit("--workloads, --trials and --repeats must be >= 1, --run-ms >= 0")
    run(args.params, args.workloads, args.trials, args.run_ms, args.repeats, args.out, args.builder_workers)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
