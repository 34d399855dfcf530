"""Streaming reader of the search stage's MetaSchedule databases.

A JSONDatabase record line is `[workload_index, [trace_json, run_secs, target, args_info]]`.
Reading a million of them must not hold their traces in memory: `scan` yields only
(workload hash, mean latency or None, file, byte offset), and `trace_at` re-reads one trace
when it is needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

FAILED_RUN_SECS = 1e9  # MetaSchedule stores a failed candidate with run_secs 1e10


@dataclass(frozen=True)
class RecordRef:
    workload_hash: str
    latency_s: float | None   # mean of run_secs; None for a failed candidate
    path: str
    offset: int


def shard_dirs(search_dir: Path | str) -> list[Path]:
    return sorted(p for p in Path(search_dir).glob("shard-*") if p.is_dir())


def workload_entries(search_dir: Path | str) -> dict[str, dict]:
    """Workload id -> its entry in the shards' `workloads.json` (spec, hash, target)."""
    out: dict[str, dict] = {}
    for shard in shard_dirs(search_dir):
        out.update({w["id"]: w for w in json.loads((shard / "workloads.json").read_text())})
    return out


def workload_hashes(shard: Path) -> list[str]:
    """Workload index -> structural hash, as the shard's database numbers them."""
    path = shard / "database_workload.json"
    if not path.exists():
        return []
    hashes = []
    with open(path) as f:
        for line in f:
            # Only the hash is needed; the module (base64, ~70 kB) is skipped unparsed.
            hashes.append(line[2:line.index('"', 2)])
    return hashes


def scan(shard: Path) -> Iterator[RecordRef]:
    hashes = workload_hashes(shard)
    path = shard / "database_tuning_record.json"
    if not path.exists():
        return
    with open(path, "rb") as f:
        offset = 0
        for raw in f:
            start, offset = offset, offset + len(raw)
            try:
                index, body = json.loads(raw)
                run_secs = body[1]
            except (json.JSONDecodeError, ValueError, IndexError, TypeError):
                continue  # a torn last line from an interrupted run
            if not 0 <= index < len(hashes):
                continue
            ok = bool(run_secs) and max(run_secs) < FAILED_RUN_SECS
            yield RecordRef(hashes[index], sum(run_secs) / len(run_secs) if ok else None, str(path), start)


def trace_at(ref: RecordRef) -> list:
    """The trace JSON ([insts, decisions]) of one record."""
    with open(ref.path, "rb") as f:
        f.seek(ref.offset)
        return json.loads(f.readline())[1][0]


DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")


def repair(shard: Path | str) -> int:
    """Cut a torn tail (an append interrupted by a kill) from a shard's JSONDatabase files,
    which TVM's JSONDatabase otherwise refuses to open. Every complete line is kept, once.
    Returns the number of bytes removed."""
    removed = 0
    for name in DATABASE_FILES:
        path = Path(shard) / name
        if not path.exists():
            continue
        keep = offset = 0
        with open(path, "rb") as f:
            for line in f:                       # append-only: only the tail can be torn
                offset += len(line)
                if not line.endswith(b"\n"):
                    break
                if line.strip():
                    try:
                        json.loads(line)
                    except json.JSONDecodeError:
                        break
                keep = offset
        size = path.stat().st_size
        if keep < size:
            with open(path, "r+b") as f:
                f.truncate(keep)
            removed += size - keep
    return removed
