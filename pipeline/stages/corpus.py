"""Stage: the pre-training corpus, scripts sampled from the design spaces of catalog workloads.

    little-dragon corpus [--workers N]

No measurement (TLM pre-trains on such randomly sampled programs): for each workload, a few
points of its MetaSchedule design space, each written in the canonical script form and checked
to decode, apply and postprocess. Parallel over worker processes, one shard (`shard_size`
workloads) per task; each finished shard is written atomically as compressed JSON lines
(`corpus/<target>/shard-00012.jsonl.xz`), so an interrupted or extended run continues where it
stopped and loses at most the shards in flight, and `dvc repro` regenerates only missing
shards. Memory stays flat: workers write their shards, the parent only counts.

Excluded, by structural hash: every workload of the search stage (their measured scripts are
the train/val/test examples, so no evaluation workload leaks in) and TVM's te_workload suite
(the external held-out benchmark).
"""

from __future__ import annotations

import json
import lzma
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from pipeline import files, params as P


@dataclass
class CorpusParams:
    # per target: {target: spec, workloads: N, samples_per_workload: K}
    targets: list = field(default_factory=lambda: [
        {"target": {"kind": "llvm", "num-cores": 2}, "workloads": 400, "samples_per_workload": 2}])
    shard_size: int = 50           # workloads per shard (the work lost at most on interruption)
    workers: int = 0                 # local cluster worker processes; 0 = all cores
    cluster: str | None = None       # a running Dask scheduler (tcp://host:8786); None: a local cluster
    seed: int = 0
    output_dir: str = "corpus"
    report: str = "reports/corpus.json"

    def __post_init__(self):
        P.require(self.shard_size >= 1, "corpus.shard_size must be >= 1")
        P.require(self.workers >= 0, "corpus.workers must be >= 0 (0 = all cores)")
        for t in self.targets:
            P.require(isinstance(t, dict) and {"target", "workloads", "samples_per_workload"} <= set(t),
                      "each corpus.targets entry needs target, workloads and samples_per_workload")
            P.require(t["workloads"] >= 0 and t["samples_per_workload"] >= 1,
                      "corpus.targets: workloads >= 0 and samples_per_workload >= 1")


def target_dir_name(target_spec) -> str:
    """`llvm`, `cuda-nvidia-h100`: a folder name per target."""
    if isinstance(target_spec, str):
        return target_spec.replace("/", "-")
    return str(target_spec.get("kind", "target"))


def shard_path(out_dir: Path, target_spec, k: int, specs: list[dict], samples: int, seed: int) -> Path:
    """A shard's file name carries a digest of what it holds (workloads, samples, seed, and
    the design space where it is not MetaSchedule's default), so a file made under other
    parameters or another space is never taken for it."""
    import hashlib

    from pipeline.space import variant
    from pipeline.tvm_env import make_target

    parts = [[s["id"] for s in specs], samples, seed, json.dumps(target_spec, sort_keys=True)]
    space = variant(make_target(target_spec))
    if space:
        parts.append(space)
    digest = hashlib.sha1(json.dumps(parts).encode()).hexdigest()[:10]
    return Path(out_dir) / target_dir_name(target_spec) / f"shard-{k:05d}-{digest}.jsonl.xz"


def make_shard(specs_json: list[dict], target_spec, samples: int, seed: int, path: str) -> dict:
    """One shard: sample, encode, check, write atomically. Runs in a worker process.
    A workload without a design space on the target, or whose samples all fail, is counted."""
    import pipeline.tvm_env  # noqa: F401  (the import fix before TVM loads its intrinsics)
    from pipeline import codec
    from pipeline.describe import describe
    from pipeline.prompts import construction_prompt
    from pipeline.space import SpaceError, sample_many
    from pipeline.tvm_env import make_target
    from pipeline.workloads import Spec, build

    target = make_target(target_spec)
    rows, no_space, failed = [], 0, 0
    for spec_json in specs_json:
        spec = Spec.from_json(spec_json)
        mod = build(spec)
        try:
            schedules = sample_many(mod, target, samples, seed=seed)
        except SpaceError:
            no_space += 1
            continue
        prompt = construction_prompt(describe(mod), target.kind.name)
        seen = set()
        for sch in schedules:
            try:
                text = codec.canonical_script(sch.trace)
                codec.decode(mod, text, target)      # decodes, applies, postprocesses
            except codec.DecodeError:
                failed += 1
                continue
            if text not in seen:                     # deduplicated per workload
                seen.add(text)
                rows.append({"workload": spec.id, "family": spec.family, "text": prompt + text})
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    tmp = f"{path}.tmp-{os.getpid()}"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(tmp, "wb", preset=6) as f:
        f.write(data)
    os.replace(tmp, path)                             # a shard exists only when complete
    return {"scripts": len(rows), "workloads": len(specs_json), "no_space": no_space, "failed": failed,
            "bytes": os.path.getsize(path)}


def plan(p: CorpusParams, exclude: set[str]) -> list[tuple[dict, int, list[dict], Path]]:
    """(target entry, shard index, specs, file) for every shard, in a fixed order."""
    from pipeline.tvm_env import structural_hash
    from pipeline.workloads import build, catalog

    # every target takes a prefix of the same eligible list: build and hash each workload once
    want = max((e["workloads"] for e in p.targets), default=0)
    eligible = []
    for spec in catalog(p.seed + 1):
        if len(eligible) >= want:
            break
        if structural_hash(build(spec)) not in exclude:
            eligible.append(spec.to_json())
    out = []
    for entry in p.targets:
        chosen = eligible[:entry["workloads"]]
        for k in range(0, len(chosen), p.shard_size):
            specs, n = chosen[k:k + p.shard_size], k // p.shard_size
            out.append((entry, n, specs, shard_path(Path(p.output_dir), entry["target"], n, specs,
                                                     entry["samples_per_workload"], p.seed + n)))
    return out


def generate(p: CorpusParams, exclude: set[str], progress: bool = True, shards: list | None = None,
             cluster: str | None = None, on_client=None) -> dict:
    """Write every missing shard of the plan (`shards`, or planned here) on a Dask cluster
    (pipeline.cluster: a local one of `p.workers` processes, or the scheduler at `cluster`);
    return the totals."""
    from pipeline import cluster as dask_cluster

    shards = plan(p, exclude) if shards is None else shards
    todo = [(e, k, s, path) for e, k, s, path in shards if not path.exists()]
    workers = min(p.workers or os.cpu_count() or 1, max(1, len(todo)))
    start = time.perf_counter()
    made = {"scripts": 0, "workloads": 0, "no_space": 0, "failed": 0}
    bar = tqdm(total=sum(len(s) for _, _, s, _ in todo), desc="corpus", unit="wl", disable=not progress)

    def done(r: dict) -> None:
        for key in made:
            made[key] += r[key]
        bar.update(r["workloads"])
        bar.set_postfix(scripts=made["scripts"], per_s=f"{made['scripts'] / (time.perf_counter() - start):.1f}")

    jobs = [(s, e["target"], e["samples_per_workload"], p.seed + k, str(path)) for e, k, s, path in todo]
    dask_cluster.run(make_shard, jobs, address=cluster, workers=workers, on_result=done, on_client=on_client)
    bar.close()
    seconds = time.perf_counter() - start
    return {"shards": len(shards), "shards_written": len(todo), "seconds_this_run": round(seconds, 1),
            "workers": workers if not cluster else cluster, "written_this_run": made,
            "scripts_per_second_this_run": round(made["scripts"] / seconds, 2) if made["scripts"] else None}


def read(paths):
    """Stream the rows of the given shards, in order."""
    for path in paths:
        with lzma.open(path, "rt") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def planned(params_path: str, target_spec) -> list[Path]:
    """The existing shards the corpus params plan for `target_spec` (what `data` reads)."""
    p = P.load("corpus", CorpusParams, params_path)
    key = json.dumps(target_spec, sort_keys=True)
    return [path for e, _, _, path in plan(p, excluded_hashes())
            if json.dumps(e["target"], sort_keys=True) == key and path.exists()]


def summarize(shards: list) -> dict:
    per_target: dict[str, dict] = {}
    for entry, _, _, path in shards:
        t = per_target.setdefault(target_dir_name(entry["target"]), {"scripts": 0, "workloads": set(), "shards": 0,
                                                                     "compressed_bytes": 0})
        if not path.exists():
            continue
        t["shards"] += 1
        t["compressed_bytes"] += path.stat().st_size
        for row in read([path]):
            t["scripts"] += 1
            t["workloads"].add(row["workload"])
    return {k: {**v, "workloads": len(v["workloads"])} for k, v in per_target.items()}


def excluded_hashes() -> set[str]:
    """The held-out workloads (TVM's te_workload suite and every evaluation kernel), by
    structural hash. The plan depends on nothing else, so changing the search stage never
    moves shard boundaries (it did when the search's workloads were left out here: raising
    the GPU search from 64 to 128 workloads orphaned the committed GPU corpus). Search
    workloads of the validation and test splits are left out when `data` reads the corpus."""
    from pipeline.workloads import held_out_hashes

    return set(held_out_hashes())


def main(params_path: str = "params.yaml", progress: bool = True, workers: int | None = None,
         cluster: str | None = None) -> dict:
    p = P.load("corpus", CorpusParams, params_path)
    if workers is not None:
        p.workers = workers
    shards = plan(p, excluded_hashes())
    run = generate(p, set(), progress, shards, cluster=cluster or p.cluster)
    report = {**run, "targets": summarize(shards)}
    files.write_json(p.report, report)
    totals = ", ".join(f"{k}: {v['scripts']} scripts over {v['workloads']} workloads "
                       f"({v['compressed_bytes'] / 1e6:.1f} MB in {v['shards']} shards)" for k, v in report["targets"].items())
    print(f"corpus: {run['shards_written']} of {run['shards']} shards written in {run['seconds_this_run']:.0f} s "
          f"with {run['workers']} workers; {totals} -> {p.output_dir}, {p.report}")
    return report
