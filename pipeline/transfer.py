"""Transfer: the search campaign's best scripts of other workloads, carried onto a new kernel.

A measured script is a design-space sketch replayed with its decisions (pipeline.sketch).
Two kernels of one operator family have sketches with the same sampling instructions in the
same order (the same tiles, categoricals and compute locations), only the loop extents differ.
So a fast script of one workload gives a script of another: walk the new kernel's sketch
and, at each sampling instruction, take the valid decision nearest to the source's:

- SamplePerfectTile: the factorization of the new extent whose inner factors (the cache and
  vector tiles, which make a schedule fast whatever the extent) are nearest the source's on a
  log scale; the outermost factor, which takes up the rest of the extent, weighs less;
- SampleCategorical: the same candidate index (unroll depth, vector width choice);
- SampleComputeLocation: the same location when the new sketch accepts it, else the nearest.

A source whose sketch has a tile more than the kernel's, for a loop of extent 1 in the source,
matches without it (`without_unit_tiles`: te_workload's depthwise convolution against the
catalog's, written as a grouped convolution with one channel a group).

The result is postprocessed like any MetaSchedule candidate; one that a postprocessor rejects
is dropped. Sources are the campaign kept in git for the target's kind (databases/), without
the data stage's validation and test workloads, as for the cost model; TVM's te_workload
kernels are never in a campaign. Used as the first batch of MetaSchedule's search
(pipeline.model_strategy.ModelFirst with `proposer=`), ranked by the pre-trained cost model or
by how little the carrying changed them (`first`):

    lib = transfer.Library.for_target(target)
    ms.tune_tir(mod, target, work, 16, strategy=ModelFirst(proposer=lib, batch=8), cost_model=xgb)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pipeline import records
from pipeline.cost_model import campaign, campaign_records
from pipeline.sketch import SAMPLING, Walk, WalkFailed, sketches
from pipeline.space import SpaceError, apply_postprocs
from pipeline.tvm_env import TVM_ERRORS, Schedule, Trace, make_target


def signature(trace: Trace) -> tuple:
    """The sampling instructions of a trace, in order, with what fixes their domain's shape:
    a tile's number of factors and innermost limit, a categorical's number of candidates."""
    out = []
    for inst in trace.insts:
        kind = inst.kind.name
        if kind == "SamplePerfectTile":
            out.append((kind, int(inst.attrs[0]), int(inst.attrs[1])))
        elif kind == "SampleCategorical":
            out.append((kind, len(inst.attrs[0])))
        elif kind in SAMPLING:
            out.append((kind,))
    return tuple(out)


def decisions(trace: Trace) -> list:
    """The decisions of a trace's sampling instructions, in order (a tile as a tuple)."""
    out = []
    for inst in trace.insts:
        if inst.kind.name in SAMPLING:
            d = trace.decisions[inst]
            out.append(tuple(int(x) for x in d) if inst.kind.name == "SamplePerfectTile" else int(d))
    return out


def without_unit_tiles(sig: tuple, old: list) -> tuple[tuple, tuple]:
    """(signature, decisions) without the tiles of loops of extent 1 (every factor 1): the same
    operator written with a unit loop more (a depthwise convolution as a grouped one, with one
    input channel a group) has one tile more and is otherwise the same sketch."""
    keep = [k for k, (s, d) in enumerate(zip(sig, old)) if not (s[0] == "SamplePerfectTile" and math.prod(d) == 1)]
    return tuple(sig[k] for k in keep), tuple(old[k] for k in keep)


def _tile_distance(new: tuple, old: tuple) -> float:
    inner = sum(abs(math.log2(a) - math.log2(b)) for a, b in zip(new[1:], old[1:]))
    return inner + 0.25 * abs(math.log2(new[0]) - math.log2(old[0]))


def nearest(kind: str, values: list, old):
    """The decision among `values` nearest the source's decision `old`."""
    if old in values:
        return old
    if kind == "SamplePerfectTile":
        return min(values, key=lambda v: _tile_distance(v, old))
    return min(values, key=lambda v: (abs(v - old), v))


def change(kind: str, new, old) -> float:
    """How far a carried decision is from the source's (0: kept as it was)."""
    if new == old:
        return 0.0
    return _tile_distance(new, old) if kind == "SamplePerfectTile" else 1.0


def retarget(mod, target, sketch: Trace, old: list) -> tuple[Schedule, float] | None:
    """`sketch` of `mod` walked with the decisions nearest `old`, then postprocessed, with the
    sum of the decisions' `change`; None when TVM refuses it or a postprocessor rejects it."""
    walk = Walk(mod, target, sketch)
    k, moved = 0, 0.0
    try:
        while (choice := walk.next()) is not None:
            if not choice.values or k >= len(old):
                return None
            new = nearest(choice.kind, choice.values, old[k])
            moved += change(choice.kind, new, old[k])
            walk.decide(new)
            k += 1
    except WalkFailed:
        return None
    finally:
        walk.close()
    sch = walk.sch
    try:
        return (sch, moved) if apply_postprocs(sch, target) else None
    except TVM_ERRORS:
        return None


@dataclass(frozen=True)
class Proposal:
    source: "Source"
    sch: Schedule
    change: float          # how far its decisions moved from the source's (transfer.change)


@dataclass(frozen=True)
class Source:
    workload: str          # the campaign workload's id
    rank: int              # 0: its fastest measured script
    latency_s: float
    signature: tuple
    decisions: tuple

    def matches(self, by_sig: dict) -> tuple[list, tuple]:
        """(the sketches of `by_sig` this source walks, with its decisions): its own signature,
        else the one without its unit tiles."""
        if self.signature in by_sig:
            return by_sig[self.signature], self.decisions
        sig, old = without_unit_tiles(self.signature, self.decisions)
        return by_sig.get(sig, []), old


class Library:
    """The fastest `per_workload` measured scripts of every workload of a search folder."""

    def __init__(self, target, search_dir: Path | str | None, exclude: set[str] = frozenset(), per_workload: int = 2):
        """`search_dir` None: an empty library (it proposes nothing)."""
        from pipeline.workloads import Spec, build

        self.target = make_target(target)
        self.sources: list[Source] = []
        if search_dir is None:
            return
        entries, by_workload = campaign_records(search_dir, self.target.kind.name, exclude, measured_only=True)
        for h in sorted(by_workload):
            refs = sorted(by_workload[h], key=lambda r: r.latency_s)[:per_workload]
            mod = build(Spec.from_json(entries[h]))
            for rank, ref in enumerate(refs):
                sch = Schedule(mod, debug_mask=0)
                try:          # a record that no longer replays (or lacks a decision) is left out
                    Trace.apply_json_to_schedule(records.trace_at(ref), sch)
                    trace = sch.trace.simplified(remove_postproc=True)
                    sig, old = signature(trace), tuple(decisions(trace))
                except TVM_ERRORS:
                    continue
                self.sources.append(Source(entries[h]["id"], rank, ref.latency_s, sig, old))
        # the campaign's fastest scripts first: every workload's best, then every second best
        self.sources.sort(key=lambda s: (s.rank, s.workload))

    @classmethod
    def for_target(cls, target, search_dir: Path | str | None = None, per_workload: int = 2) -> "Library":
        """From `search_dir`, or else the campaign kept in git for the target's kind (empty
        without one), the data stage's validation and test workloads left out."""
        with campaign(target, search_dir) as (folder, exclude, _):
            return cls(target, folder, exclude, per_workload)

    def propose(self, mod, limit: int | None = None) -> list[Proposal]:
        """Scripts of `mod` carried over from every source whose sketch matches one of `mod`'s,
        in the library's order, without duplicates; at most `limit`."""
        try:
            kernel_sketches = sketches(mod, self.target)
        except SpaceError:
            return []
        by_sig: dict[tuple, list[Trace]] = {}
        for sk in kernel_sketches:
            by_sig.setdefault(signature(sk), []).append(sk)
        out, seen = [], set()
        for src in self.sources:
            walked, old = src.matches(by_sig)
            for sk in walked:
                got = retarget(mod, self.target, sk, list(old))
                if got is None:
                    continue
                key = str(got[0].trace)
                if key not in seen:
                    seen.add(key)
                    out.append(Proposal(src, *got))
                if limit is not None and len(out) >= limit:
                    return out
        return out


def first(proposals: list[Proposal], n: int, scores: list[float] | None = None, rank: str = "cost") -> list[int]:
    """Which `n` proposals to measure first (indices). `rank="cost"`: the highest `scores` (a
    cost model's), in proposal order without scores. `rank="nearest"`: the least changed by the
    carrying (a source whose shape fits this kernel's), one per source workload before any
    second, ties broken by `scores`."""
    score = scores if scores is not None else [0.0] * len(proposals)
    if rank == "cost":
        return sorted(range(len(proposals)), key=lambda i: (-score[i], i))[:n]
    if rank != "nearest":
        raise ValueError(f"rank must be cost or nearest, got {rank!r}")
    order = sorted(range(len(proposals)), key=lambda i: (proposals[i].change, -score[i], i))
    out, used = [], set()
    for again in (False, True):
        for i in order:
            w = proposals[i].source.workload
            if len(out) < n and i not in out and (again or w not in used):
                out.append(i)
                used.add(w)
    return out
