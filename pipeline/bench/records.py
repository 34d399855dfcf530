"""Benchmark: building examples from 1 million tuning records stays under 2 GB of memory.

    little-dragon bench-records [--records 1000000]   # writes reports/bench_records.json

Synthetic records (a real trace JSON, random latencies, 100 workloads) are written in
MetaSchedule's JSONDatabase format to a temporary shard; then the data stage's streaming
pass and pair sampling run over them, and the peak resident memory (ru_maxrss) is reported.
"""

from __future__ import annotations

import json
import random
import resource
import tempfile
import time
from pathlib import Path

from pipeline import files, records
from pipeline.stages.data import sample_pairs

TRACE = [[["GetSBlock", [], ["matmul", "main"], ["b0"]], ["GetLoops", ["b0"], [], ["l1", "l2", "l3"]],
          ["SamplePerfectTile", ["l1"], [4, 64], ["v4", "v5", "v6", "v7"]],
          ["Split", ["l1", "v4", "v5", "v6", "v7"], [1, 0], ["l8", "l9", "l10", "l11"]]], [[2, [1, 2, 4, 8]]]]


def write_synthetic(shard: Path, n_records: int, n_workloads: int = 100, seed: int = 0) -> None:
    rng = random.Random(seed)
    shard.mkdir(parents=True, exist_ok=True)
    with open(shard / "database_workload.json", "w") as f:
        for w in range(n_workloads):
            f.write(json.dumps([str(10**18 + w), "AAAA"]) + "\n")
    trace = json.dumps(TRACE, separators=(",", ":"))
    with open(shard / "database_tuning_record.json", "w") as f:
        for _ in range(n_records):
            secs = [rng.lognormvariate(-7, 1) for _ in range(3)] if rng.random() > 0.05 else [1e10]
            f.write(f'[{rng.randrange(n_workloads)},[{trace},{json.dumps(secs)},{{"kind":"llvm"}},[]]]\n')


def run(n_records: int = 1_000_000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "shard-0000"
        start = time.perf_counter()
        write_synthetic(shard, n_records)
        write_s = time.perf_counter() - start
        size = (shard / "database_tuning_record.json").stat().st_size
        start = time.perf_counter()
        by_workload: dict[str, list[records.RecordRef]] = {}
        kept = 0
        for ref in records.scan(shard):
            if ref.latency_s is not None:
                by_workload.setdefault(ref.workload_hash, []).append(ref)
                kept += 1
        rng = random.Random(0)
        pairs = 0
        for refs in by_workload.values():
            refs.sort(key=lambda r: r.latency_s)
            chosen = sample_pairs([r.latency_s for r in refs], 1.05, 400, rng)
            for i, j in chosen[:5]:
                records.trace_at(refs[i]), records.trace_at(refs[j])
            pairs += len(chosen)
        scan_s = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"records": n_records, "file_mb": round(size / 2**20, 1), "valid_records": kept, "pairs_sampled": pairs,
            "write_seconds": round(write_s, 1), "scan_and_pair_seconds": round(scan_s, 1),
            "peak_rss_mb": round(peak_mb, 1), "limit_mb": 2048, "within_limit": peak_mb < 2048}


def main(n_records: int = 1_000_000, report: str = "reports/bench_records.json") -> dict:
    result = run(n_records)
    files.write_json(report, result)
    print(f"bench-records: {result['records']} records ({result['file_mb']} MB), peak RSS {result['peak_rss_mb']} MB "
          f"(limit 2048), {result['scan_and_pair_seconds']} s -> {report}")
    return result
