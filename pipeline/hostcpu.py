"""How many of the machine's cores were busy over a stretch of time (Linux `/proc/stat`).

The search stage logs it per shard: CUDA builds are CPU-bound, so a shard whose cores were all
busy needs cheaper builds, and one with idle cores can use more build workers.

    start = hostcpu.sample()
    ...
    hostcpu.cores_busy(start)   # average busy cores since `start`, None where /proc/stat is absent
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STAT = Path("/proc/stat")
_clock = time.monotonic       # tests replace this one, not time.monotonic itself


def _busy_ticks() -> int | None:
    """Busy clock ticks of all cores since boot (idle and iowait are not busy)."""
    try:
        line = STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not line or line[0] != "cpu":
        return None
    ticks = [int(x) for x in line[1:9]]     # user nice system idle iowait irq softirq steal (guest is in user)
    return sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)


def sample() -> tuple[float, int | None]:
    return _clock(), _busy_ticks()


def cores_busy(start: tuple[float, int | None]) -> float | None:
    """Average number of busy cores between `start` (from `sample()`) and now."""
    t0, before = start
    after, seconds = _busy_ticks(), _clock() - t0
    if before is None or after is None or seconds <= 0:
        return None
    return round((after - before) / os.sysconf("SC_CLK_TCK") / seconds, 2)
