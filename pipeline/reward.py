"""The RL reward: what a completion's script actually does on the machine.

Shape (RewardParams): correctness first, speed only for correct kernels.
- A script that fails gets a penalty graded by the stage it fails at:
  decode < apply < postproc < build < run < numerics (wrong numbers). A decode failure earns
  a little partial credit for the lines before its first error (at most `decode_progress`,
  which keeps it below an apply failure).
- A numerically correct kernel gets 0 from the correctness component, plus a speed bonus:
  `speed_weight * log2(speedup over the baseline)`, and, for refinement prompts,
  `source_weight * log2(speedup over the given script)`, clipped to [-bonus_floor, bonus_cap]
  so a correct kernel always outranks any failure.

Two reward functions in TRL's contract, `correctness` and `speed`, so the trainer logs each
component separately (`rewards/correctness/mean`, `rewards/speed/mean`); both read one
measurement cache keyed by (workload, script), so a script is built and timed once. Builds
and runs happen in worker processes with a timeout (verify.Checker): a script that hangs or
crashes the compiler costs only its own reward.
"""

from __future__ import annotations

import math
import threading
import zlib
from dataclasses import dataclass, field

from pipeline import params as P
from pipeline.prompts import is_refinement, source_script
from pipeline.verify import Checker, Outcome
from pipeline.workloads import Spec, build

@dataclass
class RewardParams:
    penalties: dict = field(default_factory=lambda: {
        "decode": -1.0, "apply": -0.6, "postproc": -0.5, "build": -0.4, "run": -0.35, "numerics": -0.3})
    decode_progress: float = 0.3      # partial credit for valid lines before a decode error
    decode_progress_lines: int = 24   # ... reached at this many valid lines
    speed_weight: float = 0.5
    source_weight: float = 0.5
    bonus_floor: float = 0.25
    bonus_cap: float = 2.0
    timeout_s: float = 30.0
    workers: int = 2

    def __post_init__(self):
        order = ["decode", "apply", "postproc", "build", "run", "numerics"]
        P.require(set(self.penalties) == set(order), f"reward.penalties needs exactly the stages {order}")
        values = [self.penalties[s] for s in order]
        P.require(values == sorted(values) and len(set(values)) == len(values),
                  "reward.penalties must strictly increase: decode < apply < postproc < build < run < numerics")
        P.require(self.penalties["decode"] + self.decode_progress < self.penalties["apply"],
                  "decode + decode_progress must stay below the apply penalty")
        P.require(-self.bonus_floor > values[-1], "bonus_floor must keep every correct kernel above wrong numbers")


def _text(completion) -> str:
    """TRL passes strings for standard datasets and message lists for conversational ones."""
    if isinstance(completion, list):
        completion = completion[-1]["content"] if completion else ""
    from pipeline.generate import clean

    return clean(completion)


class Measurer:
    """(workload, script) -> Outcome, measured once (timed), in parallel worker processes."""

    def __init__(self, specs: dict[str, dict], target_spec, timeout_s: float = 30.0, workers: int = 2):
        self.specs, self.target_spec = specs, target_spec
        self.checker = Checker(timeout_s=timeout_s, workers=workers)
        self.cache: dict[tuple[str, str], Outcome] = {}
        self.untimed: dict[tuple[str, str], Outcome] = {}
        self._mods: dict[str, object] = {}
        self._lock = threading.Lock()
        self.builds = 0

    def add(self, key: str, mod) -> None:
        """Measure scripts for a module that is not in the catalog (a user's kernel, te_workload)."""
        self._mods[key] = mod

    def module(self, workload: str):
        if workload not in self._mods:
            if workload not in self.specs:
                raise KeyError(f"workload {workload!r} is not in the search shards' workload entries")
            self._mods[workload] = build(Spec.from_json(self.specs[workload]))
        return self._mods[workload]

    def measure(self, pairs: list[tuple[str, str]], timed: bool = True) -> list[Outcome]:
        """Timed (latency and baseline) or not (build, run once, compare: for kernels too big
        to time repeatedly on this machine); a timed result also answers an untimed request."""
        with self._lock:
            cache = self.cache if timed else self.untimed
            todo = list(dict.fromkeys(p for p in pairs if p not in self.cache and p not in cache))
            if todo:     # every kernel's scripts side by side
                outs = self.checker.check_pairs([(self.module(w), s) for w, s in todo], self.target_spec, timed=timed)
                self.builds += len(todo)
                cache.update(zip(todo, outs))
            return [self.cache.get(p) or cache[p] for p in pairs]


@dataclass
class Scored:
    stage: str
    correctness: float
    speed: float
    speedup_vs_baseline: float | None
    speedup_vs_source: float | None

    @property
    def total(self) -> float:
        return self.correctness + self.speed


def score(outcome: Outcome, source: Outcome | None, rp: RewardParams) -> Scored:
    if not outcome.correct:
        pen = rp.penalties[outcome.stage]
        if outcome.stage == "decode" and outcome.line > 1:
            pen += rp.decode_progress * min(outcome.line - 1, rp.decode_progress_lines) / rp.decode_progress_lines
        return Scored(outcome.stage, pen, 0.0, None, None)
    s_base = outcome.speedup
    s_src = (source.latency_s / outcome.latency_s
             if source is not None and source.correct and source.latency_s and outcome.latency_s else None)
    bonus = 0.0
    if s_base:
        bonus += rp.speed_weight * math.log2(s_base)
    if s_src:
        bonus += rp.source_weight * math.log2(s_src)
    return Scored("ok", 0.0, max(-rp.bonus_floor, min(rp.bonus_cap, bonus)), s_base, s_src)


class ShapedReward:
    """Holds the measurer and the log of every scored completion; `functions()` gives the
    reward callables for `GRPOTrainer(reward_funcs=...)`."""

    def __init__(self, measurer: Measurer, rp: RewardParams):
        self.measurer, self.rp = measurer, rp
        self.log: list[dict] = []
        self.step = 0

    def scores(self, prompts, completions, workload, complete=None) -> list[Scored]:
        texts = [_text(c) for c in completions]
        sources = [source_script(p if isinstance(p, str) else p[-1]["content"]) for p in prompts]
        outs = self.measurer.measure(list(zip(workload, texts)))
        if complete is not None:   # guided rollouts: a script cut short is a failure, never a short correct one
            outs = [o if c is not False else Outcome("decode", "incomplete", line=t.count("\n") + 1)
                    for o, c, t in zip(outs, complete, texts)]
        src_pairs = [(w, s) for w, s in zip(workload, sources) if s is not None]
        src_outs = dict(zip(src_pairs, self.measurer.measure(src_pairs)))
        return [score(o, src_outs.get((w, s)) if s is not None else None, self.rp)
                for o, w, s in zip(outs, workload, sources)]

    def functions(self):
        def correctness(prompts, completions, workload, complete=None, **_):
            scored = self.scores(prompts, completions, workload, complete)
            self.step += 1
            for s, w, p in zip(scored, workload, prompts):
                self.log.append({"step": self.step, "workload": w, "prompt": zlib.crc32(str(p).encode()), "task": "refinement" if is_refinement(str(p))
                                 else "construction", "stage": s.stage, "correctness": s.correctness,
                                 "speed": s.speed, "speedup_vs_baseline": s.speedup_vs_baseline,
                                 "speedup_vs_source": s.speedup_vs_source})
            return [s.correctness for s in scored]

        def speed(prompts, completions, workload, complete=None, **_):
            scored = self.scores(prompts, completions, workload, complete)  # cached: no second build
            return [s.speed for s in scored]

        return [correctness, speed]
