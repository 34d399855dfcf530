"""Benchmark: the build pool's recycle. `cold`: the pool is replaced when a round needs it, so
that round's builds wait for the new workers to start (a process that imports TVM each);
`warm` (PoolBuilder now): the first pool's workers start before the first round and each
successor's beside the old pool's last round.

    python -m pipeline.bench.pool_recycle [--workers 2] [--rounds 9] [--recycle-after 2] \
        [--gap 4] [--repeats 2] [--out reports/bench_pool_recycle_cpu.json]

A round builds `workers` candidates (a CPU matmul, each its own schedule); between rounds the
main thread waits `gap` seconds, standing in for the search strategy's turn. The variants
alternate, `repeats` times each; reported: each round's build wall time and their sum.
"""

from __future__ import annotations

import argparse
import time

from pipeline import files


def _cold_builder(workers: int, recycle_after: int):
    from pipeline.tuning import Phases, PoolBuilder
    from pipeline.tvm_env import tvm

    @tvm.ir.utils.derived_object
    class Cold(PoolBuilder._cls):   # the recycle as it was: a fresh pool only when a round asks for one
        def warm(self) -> None:
            pass

        def _start_successor(self) -> None:
            pass

    return Cold(workers, 60.0, Phases(), recycle_after=recycle_after)


def run_variant(variant: str, workers: int, rounds: int, recycle_after: int, gap: float) -> dict:
    from pipeline.tuning import Phases, PoolBuilder
    from pipeline.tvm_env import make_target, ms
    from pipeline.workloads import Spec, build

    target = make_target({"kind": "llvm", "num-cores": 2})
    mod = build(Spec("matmul", (16, 256, 256), "float32"))
    inputs = [ms.builder.BuilderInput(mod, target) for _ in range(workers)]
    builder = PoolBuilder(workers, 60.0, Phases(), recycle_after=recycle_after) if variant == "warm" \
        else _cold_builder(workers, recycle_after)
    times = []
    try:
        builder.warm()
        time.sleep(gap)            # the stage's start before its first round (runner, first search)
        for _ in range(rounds):
            start = time.perf_counter()
            out = builder.build(inputs)
            times.append(round(time.perf_counter() - start, 3))
            assert all(r.error_msg is None for r in out), [r.error_msg for r in out]
            time.sleep(gap)
    finally:
        builder.shutdown()
    return {"variant": variant, "round_build_s": times, "build_s": round(sum(times), 2)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--recycle-after", type=int, default=2)
    ap.add_argument("--gap", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="reports/bench_pool_recycle_cpu.json")
    a = ap.parse_args(argv)
    runs = []
    for _ in range(a.repeats):
        for variant in ("cold", "warm"):
            runs.append(run_variant(variant, a.workers, a.rounds, a.recycle_after, a.gap))
            print(runs[-1], flush=True)
    files.write_json(a.out, {"workers": a.workers, "rounds": a.rounds, "recycle_after": a.recycle_after,
                             "gap_s": a.gap, "runs": runs})


if __name__ == "__main__":
    main()
