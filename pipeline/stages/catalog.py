"""Stage 0: the workload catalog.

    little-dragon catalog            # data/catalog.jsonl: every spec, with its stable id
    little-dragon catalog --verify   # + reports/catalog.json: distinct structural hashes, held-out check

Verification builds and hashes every workload (~1 ms each, about a minute for the catalog).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from tqdm import tqdm

from pipeline import files, params as P
from pipeline.tvm_env import structural_hash
from pipeline.workloads import build, catalog, held_out_hashes


@dataclass
class CatalogParams:
    seed: int = 0
    output: str = "data/catalog.jsonl"
    report: str = "reports/catalog.json"


def verify(specs, progress: bool = True) -> dict:
    """Hash every workload: how many are distinct, and which coincide with the held-out suite."""
    held = held_out_hashes()
    seen: dict[str, str] = {}
    duplicates, held_out_hits = [], []
    start = time.perf_counter()
    for spec in tqdm(specs, desc="hash workloads", unit="wl", disable=not progress):
        h = structural_hash(build(spec))
        if h in held:
            held_out_hits.append({"id": spec.id, "held_out": held[h]})
        if h in seen:
            duplicates.append({"id": spec.id, "same_as": seen[h]})
        else:
            seen[h] = spec.id
    return {
        "workloads": len(specs),
        "distinct_structural_hashes": len(seen),
        "duplicates": duplicates[:20],
        "held_out_suite_size": len(held),
        "held_out_collisions": held_out_hits,
        "per_family": dict(collections.Counter(s.family for s in specs)),
        "per_dtype": dict(collections.Counter(s.dtype for s in specs)),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(params_path: str = "params.yaml", check: bool = False) -> None:
    p = P.load("catalog", CatalogParams, params_path)
    specs = catalog(p.seed)
    files.write_jsonl(p.output, (s.to_json() for s in specs))
    print(f"catalog: {len(specs)} workloads -> {p.output}")
    if check:
        report = verify(specs)
        files.write_json(p.report, report)
        print(f"catalog: {report['distinct_structural_hashes']} distinct structural hashes, "
              f"{len(report['held_out_collisions'])} held-out collisions -> {p.report}")
