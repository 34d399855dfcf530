"""Held-out catalog workloads for the evaluation: kernels no stage ever trains on.

The corpus takes a prefix of the catalog in its own shuffled order (`catalog(corpus.seed + 1)`,
as many eligible workloads as its largest target asks for), and the search takes a round-robin
slice of another order. The evaluation's catalog workloads come from the *end* of the corpus's
order, where its prefix cannot reach (every chosen one sits past `prefix + held-out count`, so
even a corpus that skipped every te_workload kernel before it stops short of them), are not
search workloads, are within the search's size limits and families (so the GPU can time them
like the campaign's), and have a design space for the target (the model writes from it).
Families are taken round-robin, so a small number covers them all.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from pathlib import Path

from pipeline import files
from pipeline.workloads import Spec


class HeldOutError(ValueError):
    """Not enough catalog workloads satisfy the held-out rules."""


def catalog_workloads(n: int, corpus_seed: int, corpus_prefix: int, families: list[str], max_mflop: float,
                      max_elements: int, exclude_ids: set[str], target, cache: Path | None = None) -> list[Spec]:
    """`n` held-out catalog workloads (see the module docstring), in a fixed order. Choosing
    them samples a design space per candidate (25 s for the GPU profile's 50 on 2 cores, at the
    start of every evaluation step): with `cache`, a file that keeps the choice for these
    arguments and this code."""
    from pipeline import space, workloads

    key = {"n": n, "corpus_seed": corpus_seed, "corpus_prefix": corpus_prefix, "families": list(families),
           "max_mflop": max_mflop, "max_elements": max_elements, "target": str(target),
           "exclude": hashlib.sha256("\n".join(sorted(exclude_ids)).encode()).hexdigest()[:16],
           # the code the choice depends on: this module, the catalog, the design spaces
           "code": files.source_digest(__file__, space.__file__, workloads.__file__)}
    kept = files.read_keyed(cache, key) if cache is not None else None
    if kept is not None:
        return [Spec.from_json(x) for x in kept]
    chosen = _choose(n, corpus_seed, corpus_prefix, families, max_mflop, max_elements, exclude_ids, target)
    if cache is not None:
        files.write_keyed(cache, key, [spec.to_json() for spec in chosen])
    return chosen


def _choose(n: int, corpus_seed: int, corpus_prefix: int, families: list[str], max_mflop: float,
            max_elements: int, exclude_ids: set[str], target) -> list[Spec]:
    from tvm.s_tir.analysis import estimate_tir_flops

    from pipeline.measure import arg_specs
    from pipeline.space import SpaceError, sample_many
    from pipeline.tvm_env import structural_hash
    from pipeline.workloads import build, catalog, held_out_hashes

    if n <= 0:
        return []
    order = catalog(corpus_seed + 1)
    held = held_out_hashes()
    reach = corpus_prefix + len(held)          # the corpus never takes a workload at or past this index
    by_family: dict[str, list[Spec]] = defaultdict(list)
    for i in range(len(order) - 1, reach - 1, -1):
        spec = order[i]
        if spec.family in families and spec.id not in exclude_ids:
            by_family[spec.family].append(spec)
    queues = [by_family[f] for f in families if by_family[f]]
    chosen: list[Spec] = []
    while queues and len(chosen) < n:
        for q in list(queues):
            while q:
                spec = q.pop(0)
                mod = build(spec)
                if (estimate_tir_flops(mod) > max_mflop * 1e6
                        or sum(math.prod(shape) for shape, _ in arg_specs(mod)) > max_elements
                        or structural_hash(mod) in held):
                    continue
                try:
                    has_space = bool(sample_many(mod, target, 1, seed=0))
                except SpaceError:
                    has_space = False
                if not has_space:
                    continue
                chosen.append(spec)
                break
            if not q:
                queues.remove(q)
            if len(chosen) == n:
                break
    if len(chosen) < n:
        raise HeldOutError(f"only {len(chosen)} catalog workloads past the corpus's reach fit the held-out rules; "
                           f"asked for {n} (lower evaluate.catalog_workloads or corpus sizes)")
    return chosen
