"""Small statistics shared by stages and benchmarks; importing it loads nothing heavy (the
evaluate stage takes ~10 s to import, its TVM and torch included)."""

from __future__ import annotations

import math


def geomean(xs) -> float | None:
    """The geometric mean of the positive numbers in `xs`; None, 0 and negatives (a task with no
    correct kernel, a missing ratio) are left out, and None when nothing is left."""
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None
