"""Stage 2: training data from the search databases, and a pre-training corpus.

    little-dragon data

Writes `data/dataset/{train,val,test}.jsonl` (construction and refinement examples),
`data/dataset/corpus.jsonl` (the corpus stage's scripts for the training target: the
pre-training corpus, as TLM does), and `reports/data.json`, `reports/data.md`, `reports/data.png`.

- Construction: kernel -> one of its `top_k` best measured scripts.
- Refinement: kernel + a measured script -> a measured script of the same workload at least
  `min_speedup` times faster. Pairs are drawn from *all* measured candidates.
- Splits are by workload: validation and test workloads never appear in training, nor in the
  corpus. Rows are deduplicated on (prompt, completion).
- Records are streamed (`pipeline.records`): only (hash, latency, offset) stay in memory.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml
from tqdm import tqdm

from pipeline import codec, files, guided, params as P, records
from pipeline.describe import describe
from pipeline.prompts import construction_prompt, refinement_prompt
from pipeline.tvm_env import make_target
from pipeline.workloads import Spec, build


@dataclass
class DataParams:
    search_dir: str = "data/search"
    output_dir: str = "data/dataset"
    min_speedup: float = 1.05        # a refinement target must be at least this much faster
    top_k_construction: int = 4
    max_pairs_per_workload: int = 400
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    corpus_max: int | None = None    # at most this many corpus scripts in corpus.jsonl (None: all)
    seed: int = 0
    # A kept {workload id: split} (JSON, in git): its assignments never change, and a workload
    # it lacks is split by its own hash alone, so a growing search never moves a workload across
    # splits (a model trained before the growth would otherwise be tested on what it learned
    # from). Written with the first run's split when missing. None: split by rank (below).
    splits_file: str | None = None
    report: str = "reports/data.json"

    def __post_init__(self):
        P.require(self.min_speedup >= 1.0, "min_speedup must be >= 1.0 (a target faster than its source)")
        P.require(self.top_k_construction >= 1, "top_k_construction must be >= 1")
        P.require(0 <= self.val_fraction < 0.5 and 0 <= self.test_fraction < 0.5, "split fractions must be in [0, 0.5)")


SPLITS = ("train", "val", "test")


def assign_splits(workload_ids: list[str], val_fraction: float, test_fraction: float, seed: int,
                  frozen: dict[str, str] | None = None) -> dict[str, str]:
    """Deterministic split by workload: a workload's examples all land in one split. Without
    `frozen`, by the rank of the workloads' hashes (exact fractions, but a workload added to the
    search can push another across a boundary); with it, its assignments stand and every other
    workload's split follows from its own hash, whatever else the search holds."""
    def digest(w: str) -> str:
        return hashlib.sha1(f"{seed}:{w}".encode()).hexdigest()

    if frozen is not None:
        def own(w: str) -> str:
            u = int(digest(w), 16) / 16 ** 40
            return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"
        return {w: frozen.get(w) or own(w) for w in workload_ids}
    order = sorted(workload_ids, key=digest)
    n = len(order)
    n_test = max(1, round(n * test_fraction)) if n >= 3 and test_fraction > 0 else 0
    n_val = max(1, round(n * val_fraction)) if n >= 3 and val_fraction > 0 else 0
    return {w: ("test" if i < n_test else "val" if i < n_test + n_val else "train") for i, w in enumerate(order)}


def frozen_splits(p: DataParams) -> dict[str, str] | None:
    """The kept assignments of `p.splits_file` (None without one)."""
    if not p.splits_file or not Path(p.splits_file).exists():
        return None
    frozen = json.loads(Path(p.splits_file).read_text())
    if not isinstance(frozen, dict) or any(s not in SPLITS for s in frozen.values()):
        raise ValueError(f"{p.splits_file}: must map workload ids to train, val or test")
    return frozen


def sample_pairs(latencies: list[float], min_speedup: float, limit: int, rng: random.Random) -> list[tuple[int, int]]:
    """Up to `limit` (slower, faster) index pairs with latency ratio >= min_speedup, uniformly
    from all qualifying pairs. Enumerates when n^2 is small; otherwise samples by rejection so
    memory stays O(limit) even for a workload with 10^5 candidates."""
    n = len(latencies)
    if n * n <= 250_000:
        pairs = [(i, j) for i in range(n) for j in range(n) if latencies[i] >= min_speedup * latencies[j]]
        rng.shuffle(pairs)
        return pairs[:limit]
    chosen: set[tuple[int, int]] = set()
    for _ in range(limit * 50):
        if len(chosen) >= limit:
            break
        i, j = rng.randrange(n), rng.randrange(n)
        if latencies[i] >= min_speedup * latencies[j]:
            chosen.add((i, j))
    return sorted(chosen, key=lambda _: rng.random())


def _load_workloads(search_dir: str) -> dict[str, dict]:
    """hash -> workload entry (spec, target, baseline latency)."""
    out = {}
    for shard in records.shard_dirs(search_dir):
        baselines = json.loads((shard / "baselines.json").read_text()) if (shard / "baselines.json").exists() else {}
        for w in json.loads((shard / "workloads.json").read_text()):
            out[w["hash"]] = {**w, "baseline_s": baselines.get(w["id"], {}).get("latency_s")}
    return out


def build_examples(p: DataParams, progress: bool = True) -> tuple[list[dict], dict]:
    workloads = _load_workloads(p.search_dir)
    if not workloads:
        raise FileNotFoundError(f"no search output in {p.search_dir}: run `little-dragon search` first")
    # Pass 1 (streaming): keep latency and file offset per candidate, no traces.
    refs: dict[str, list[records.RecordRef]] = defaultdict(list)
    n_records = n_failed = 0
    for shard in records.shard_dirs(p.search_dir):
        for ref in records.scan(shard):
            n_records += 1
            if ref.latency_s is None:
                n_failed += 1
            elif ref.workload_hash in workloads:
                refs[ref.workload_hash].append(ref)
    frozen = frozen_splits(p)
    splits = assign_splits([workloads[h]["id"] for h in refs], p.val_fraction, p.test_fraction, p.seed, frozen)
    if p.splits_file and frozen is None:
        files.write_json(p.splits_file, dict(sorted(splits.items())))
    rng = random.Random(p.seed)
    rows: list[dict] = []
    seen: set[tuple[str, str]] = set()
    in_space = [0, 0]       # scripts inside the guided decoder's space, scripts encoded
    for h in tqdm(sorted(refs, key=lambda h: workloads[h]["id"]), desc="examples", disable=not progress):
        w = workloads[h]
        spec, target = Spec.from_json(w), make_target(w["target"])
        mod = build(spec)
        description = describe(mod)
        baseline = w["baseline_s"]
        cands = sorted(refs[h], key=lambda r: r.latency_s)
        cache: dict[int, str | None] = {}
        templates = None

        def script(ref: records.RecordRef) -> str | None:
            nonlocal templates
            if ref.offset not in cache:
                try:
                    text = codec.canonical_from_json(mod, records.trace_at(ref))
                    codec.decode(mod, text, target)   # it decodes, applies and postprocesses
                except (codec.DecodeError, TypeError, ValueError):
                    text = None
                cache[ref.offset] = text
                if text is not None:   # the share of the data the guided decoder can write
                    if templates is None:
                        templates = guided.make_templates(mod, target)
                    in_space[0] += guided.in_space(mod, target, text, templates)
                    in_space[1] += 1
            return cache[ref.offset]

        def add(row: dict) -> None:
            key = (row["prompt"], row["completion"])
            if row["completion"] is not None and key not in seen:
                seen.add(key)
                rows.append({"workload": w["id"], "family": w["family"], "split": splits[w["id"]],
                             "target": target.kind.name, "baseline_s": baseline, **row})

        for ref in cands[: p.top_k_construction]:
            add({"task": "construction", "prompt": construction_prompt(description, target.kind.name),
                 "completion": script(ref), "latency_s": ref.latency_s, "source_latency_s": None,
                 "speedup_vs_source": None,
                 "speedup_vs_baseline": baseline / ref.latency_s if baseline else None})
        for i, j in sample_pairs([c.latency_s for c in cands], p.min_speedup, p.max_pairs_per_workload, rng):
            src, dst = cands[i], cands[j]
            src_script = script(src)
            if src_script is None:
                continue
            rel = baseline / src.latency_s if baseline else 1.0
            add({"task": "refinement",
                 "prompt": refinement_prompt(description, target.kind.name, src_script, rel),
                 "completion": script(dst), "latency_s": dst.latency_s, "source_latency_s": src.latency_s,
                 "speedup_vs_source": src.latency_s / dst.latency_s,
                 "speedup_vs_baseline": baseline / dst.latency_s if baseline else None})
    stats = {"records": n_records, "failed_records": n_failed, "workloads": len(refs),
             "scripts_in_guided_space": in_space[0], "scripts_encoded": in_space[1]}
    if p.splits_file:   # how many workloads kept their recorded split (the rest: by their own hash)
        stats["splits_kept"] = len(splits) if frozen is None else sum(w in frozen for w in splits)
    return rows, stats


def load_corpus(p: DataParams, exclude_ids: set[str], target_spec, params_path: str = "params.yaml") -> list[dict]:
    """The corpus stage's scripts for the training target, minus any workload of the
    validation and test splits (the corpus stage leaves out only the held-out kernels, so
    its shards do not move when the search changes)."""
    from pipeline.stages.corpus import planned, read

    rows = []
    for row in read(planned(params_path, target_spec)):
        if row["workload"] in exclude_ids:
            continue
        rows.append({"workload": row["workload"], "text": row["text"]})
        if p.corpus_max is not None and len(rows) >= p.corpus_max:
            break
    return rows


def summarize(rows: list[dict], stats: dict, corpus: list[dict], p: DataParams) -> dict:
    by_split = defaultdict(lambda: defaultdict(int))
    for r in rows:
        by_split[r["split"]][r["task"]] += 1
    refine = [r["speedup_vs_source"] for r in rows if r["task"] == "refinement"]
    lengths = [len(r["completion"]) for r in rows]
    return {
        **stats,
        "examples": len(rows),
        "by_split": {k: dict(v) for k, v in by_split.items()},
        "split_workloads": {s: len({r["workload"] for r in rows if r["split"] == s}) for s in ("train", "val", "test")},
        "min_speedup": p.min_speedup,
        "refinement_speedup": {"median": statistics.median(refine), "max": max(refine), "min": min(refine)} if refine else None,
        "script_chars": {"mean": statistics.mean(lengths), "max": max(lengths)} if lengths else None,
        "corpus_scripts": len(corpus),
    }


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    refine = [math.log2(r["speedup_vs_source"]) for r in rows if r["task"] == "refinement"]
    axes[0].hist(refine, bins=30)
    axes[0].set_xlabel("log2 speedup, refinement target vs source")
    axes[0].set_ylabel("examples")
    axes[1].hist([len(r["completion"]) for r in rows], bins=30)
    axes[1].set_xlabel("script length (chars)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(params_path: str = "params.yaml", progress: bool = True) -> dict:
    p = P.load("data", DataParams, params_path)
    # The corpus is sampled for the search stage's target (one source of truth for it).
    target_spec = yaml.safe_load(Path(params_path).read_text())["search"]["target"]
    rows, stats = build_examples(p, progress)
    eval_ids = {r["workload"] for r in rows if r["split"] != "train"}
    corpus = load_corpus(p, eval_ids, target_spec, params_path)
    if not corpus:
        print(f"data: no corpus scripts for {target_spec} (run `little-dragon corpus`); "
              "SFT will skip pre-training")
    out = Path(p.output_dir)
    for split in ("train", "val", "test"):
        files.write_jsonl(out / f"{split}.jsonl", (r for r in rows if r["split"] == split))
    files.write_jsonl(out / "corpus.jsonl", corpus)
    summary = summarize(rows, stats, corpus, p)
    files.write_json(p.report, summary)
    _plot(rows, str(Path(p.report).with_suffix(".png")))
    _write_markdown(summary, str(Path(p.report).with_suffix(".md")))
    print(f"data: {summary['examples']} examples {summary['by_split']}, {len(corpus)} corpus scripts -> {out}")
    return summary


def _write_markdown(s: dict, path: str) -> None:
    lines = ["# Training data", "", f"- records read: {s['records']} ({s['failed_records']} failed candidates)",
             f"- workloads: {s['workloads']} (train/val/test: {s['split_workloads']})",
             f"- examples: {s['examples']}", f"- pre-training corpus: {s['corpus_scripts']} scripts",
             f"- measured scripts inside the guided decoder's space: {s.get('scripts_in_guided_space')} of "
             f"{s.get('scripts_encoded')}", "",
             "| split | construction | refinement |", "| --- | --- | --- |"]
    for split in ("train", "val", "test"):
        d = s["by_split"].get(split, {})
        lines.append(f"| {split} | {d.get('construction', 0)} | {d.get('refinement', 0)} |")
    if s["refinement_speedup"]:
        r = s["refinement_speedup"]
        lines += ["", f"Refinement pairs: target at least {s['min_speedup']}x faster than source; "
                  f"median {r['median']:.2f}x, max {r['max']:.1f}x.", ""]
    lines += ["![speedups and script lengths](data.png)", ""]
    files.write_text_atomic(path, "\n".join(lines))
