"""Benchmark: corpus stage throughput (checked scripts per second) by worker count.

    python -m pipeline.bench.corpus [--workers 1 2 8 16] [--workloads 64] [--out reports/bench_corpus.json]

Each run makes the same shards from scratch in a temporary folder (the corpus stage's own code:
sample, encode, decode-check, compress, write), for the LLVM and the CUDA target.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile


def run(workers: list[int], workloads: int, cuda_workloads: int, samples: int) -> dict:
    from pipeline.stages.corpus import CorpusParams, excluded_hashes, generate

    exclude = excluded_hashes()
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "runs": []}
    for target, n in (({"kind": "llvm", "num-cores": 2}, workloads), ("nvidia/nvidia-h100", cuda_workloads)):
        if not n:
            continue
        for w in workers:
            with tempfile.TemporaryDirectory() as tmp:
                p = CorpusParams(targets=[{"target": target, "workloads": n, "samples_per_workload": samples}],
                                 shard_size=max(1, n // (4 * w)), workers=w, output_dir=tmp, report=f"{tmp}/r.json")
                r = generate(p, exclude, progress=False)
            row = {"target": target, "workers": w, "workloads": n, "scripts": r["written_this_run"]["scripts"],
                   "seconds": r["seconds_this_run"], "scripts_per_second": r["scripts_per_second_this_run"]}
            out["runs"].append(row)
            print(row, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--workloads", type=int, default=64)
    ap.add_argument("--cuda-workloads", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--out", default="reports/bench_corpus.json")
    args = ap.parse_args()
    from pipeline import files

    files.write_json(args.out, run(args.workers, args.workloads, args.cuda_workloads, args.samples))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
