"""`little-dragon tune KERNEL --trials N`: model-guided tuning of one kernel.

Round 1 (construction): the model writes a batch of scripts for the kernel (guided decoding:
every script is inside the kernel's design space). Each is checked and timed like every
script in this project (pipeline.verify: built, run, compared with the reference, timed in
a worker). Round 2 on (refinement): the best measured scripts go back to the model in
refinement prompts that carry their measured speedup, and it writes faster ones. Rounds go
on until N distinct candidates are measured. A round in which the model writes fewer new scripts
than the batch (it repeats itself: a small model on a small design space) is filled from the
kernel's design space, MetaSchedule's random sampling (pipeline.space.sample_many), so the
budget is spent; each candidate's source is kept, and `sampled` counts them (`fill=False`:
the model's scripts only, stopping after a few rounds with nothing new).

With a cost model (pipeline.cost_model: MetaSchedule's XGBoost model, pre-trained on measured
search databases and updated with every candidate measured here), the model writes
`oversample` times the batch each round and the cost model picks the batch to measure, as
MetaSchedule's evolutionary search measures the best-predicted of its population. The
budget N counts measured candidates either way.

Every measured candidate goes into a MetaSchedule `JSONDatabase` in the work folder (failed
ones with run_secs 1e10, as MetaSchedule stores them), so TVM's own tools read the result:
`ms.database.JSONDatabase(work_dir=...).query_schedule(mod, target, "main")`. `tune.jsonl`
keeps each candidate's script, round, outcome and latency. Resumable: a second run with the
same work folder continues from both files and measures nothing twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import files


@dataclass
class TuneResult:
    measured: int = 0
    correct: int = 0
    rounds: int = 0
    best_latency_s: float | None = None
    baseline_s: float | None = None
    best_script: str | None = None
    curve: list[float | None] = field(default_factory=list)   # best latency after each candidate
    seconds: float = 0.0
    generation_seconds: float = 0.0
    written: int = 0              # distinct new scripts the model wrote (>= measured with a cost model)
    sampled: int = 0              # candidates measured from the design space (rounds the model had too few new)
    cost_data: str = ""           # what the cost model was pre-trained on ("" : no cost model)
    stopped: str = ""

    @property
    def speedup(self) -> float | None:
        return self.baseline_s / self.best_latency_s if self.baseline_s and self.best_latency_s else None

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["speedup"] = self.speedup
        return out


class Tuner:
    """The tuning loop for one kernel; `model`/`tok` are a loaded model and tokenizer."""

    def __init__(self, mod, target_spec, model, tok, work_dir, batch: int = 8, keep: int = 2,
                 timeout_s: float = 60.0, workers: int = 2, seed: int = 0, checker=None,
                 cost_model=None, oversample: int = 1, fill: bool = True):
        from pipeline.describe import describe
        from pipeline.tvm_env import make_target, ms
        from pipeline.verify import Checker

        self.mod, self.target_spec, self.target = mod, target_spec, make_target(target_spec)
        self.model, self.tok, self.batch, self.keep, self.seed = model, tok, batch, keep, seed
        self.fill = fill
        self.work = Path(work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        from pipeline import records

        records.repair(self.work)     # an interrupted run may have left half a record
        self.db = ms.database.JSONDatabase(work_dir=str(self.work))
        self.workload = self.db.commit_workload(mod)
        self.description = describe(mod)
        self.checker = checker or Checker(timeout_s=timeout_s, workers=workers)
        self.log_path = self.work / "tune.jsonl"
        self.seen: dict[str, dict] = {}
        for row in files.read_jsonl(self.log_path) if self.log_path.exists() else []:
            self.seen[row["script"]] = row
        if oversample < 1:
            raise ValueError(f"oversample must be >= 1, got {oversample}")
        self.cost_model, self.oversample = cost_model, oversample if cost_model is not None else 1
        if cost_model is not None and self.seen:     # a resumed run: what it measured already
            cost_model.add(mod, list(self.seen), [r["latency_s"] for r in self.seen.values()])

    # -- rounds ---------------------------------------------------------------------------
    def prompts(self) -> list[tuple[str, int]]:
        """(prompt, attempts): construction first; then refinement of the `keep` best."""
        from pipeline.prompts import construction_prompt, refinement_prompt

        best = sorted((r for r in self.seen.values() if r["latency_s"]), key=lambda r: r["latency_s"])[: self.keep]
        if not best:
            return [(construction_prompt(self.description, self.target.kind.name), self.batch * self.oversample)]
        per = max(1, self.batch * self.oversample // len(best))
        return [(refinement_prompt(self.description, self.target.kind.name, r["script"],
                                   (r["baseline_s"] / r["latency_s"]) if r["baseline_s"] else 1.0), per)
                for r in best]

    def write(self, round_: int) -> tuple[list[str], float]:
        """This round's scripts: every prompt's attempts in one batched generation (the
        refinement prompts of a round have the same number of attempts each)."""
        from pipeline.generate import GenerationParams, generate

        prompts = self.prompts()
        g = GenerationParams(attempts=prompts[0][1], guided=True)
        w = generate(self.model, self.tok, [p for p, _ in prompts], g, seed=self.seed + 1000 * round_,
                     kernels=[(self.mod, self.target)] * len(prompts))
        scripts = [s for i in range(len(prompts)) for s, done in zip(w.scripts[i], w.complete[i]) if s and done]
        return scripts, w.seconds

    def from_space(self, n: int, round_: int, exclude: set[str]) -> list[str]:
        """Up to `n` new scripts from the design space (random decisions, as MetaSchedule's
        replay samples; with a cost model, its best-predicted of `oversample` times as many)."""
        from pipeline import codec
        from pipeline.space import SpaceError, sample_many

        try:
            schedules = sample_many(self.mod, self.target, n * self.oversample, seed=self.seed + 7919 * round_)
        except SpaceError:
            return []
        out: list[str] = []
        for sch in schedules:
            try:
                text = codec.canonical_script(sch.trace)
            except codec.DecodeError:
                continue
            if text not in self.seen and text not in exclude and text not in out:
                out.append(text)
        return self.choose(out, n)

    def measure(self, scripts: list[str], round_: int, sources: list[str] | None = None) -> list[dict]:
        """Check and time `scripts` in one batch; `sources[i]`: where script i came from."""
        outcomes = self.checker.check_many(self.mod, scripts, self.target_spec, timed=True)
        rows = []
        for script, o, source in zip(scripts, outcomes, sources or ["model"] * len(scripts)):
            row = {"script": script, "round": round_, "source": source, "stage": o.stage, "error": o.error,
                   "latency_s": o.latency_s if o.correct else None, "baseline_s": o.baseline_s}
            self._commit(script, row["latency_s"])
            files.append_jsonl(self.log_path, row)
            self.seen[script] = row
            rows.append(row)
        if self.cost_model is not None:
            self.cost_model.add(self.mod, scripts, [r["latency_s"] for r in rows])
        return rows

    def choose(self, fresh: list[str], n: int) -> list[str]:
        """The `n` of this round's new scripts to measure: the cost model's best-predicted, or
        (without one) the first `n` the model wrote."""
        if self.cost_model is None or len(fresh) <= n:
            return fresh[:n]
        return self.cost_model.pick(self.mod, fresh, n)

    def _commit(self, script: str, latency_s: float | None) -> None:
        """The candidate as a MetaSchedule tuning record (1e10 s when it failed, as MetaSchedule
        stores a failed candidate); a script that does not even apply has no trace to store."""
        from pipeline import codec
        from pipeline.tvm_env import Schedule, TVM_ERRORS, ms

        try:
            sch = Schedule(self.mod, debug_mask=0)
            codec.decode(self.mod, script, self.target).apply_to_schedule(sch, remove_postproc=False)
        except (codec.DecodeError, *TVM_ERRORS):
            return
        self.db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, self.workload, [latency_s if latency_s else 1e10], self.target,
            ms.arg_info.ArgInfo.from_prim_func(self.mod["main"])))

    def run(self, trials: int, max_idle_rounds: int = 3, progress: bool = True) -> TuneResult:
        from tqdm import tqdm

        start = time.perf_counter()
        result = TuneResult()
        rows = list(self.seen.values())
        idle, round_ = 0, 1 + max((r["round"] for r in rows), default=0)
        wrote: set[str] = set()
        bar = tqdm(total=trials, initial=min(len(rows), trials), desc="tune", unit="candidate", disable=not progress)
        while len(rows) < trials:
            scripts, gen_s = self.write(round_)
            result.generation_seconds += gen_s
            new = list(dict.fromkeys(s for s in scripts if s not in self.seen))
            wrote.update(new)
            result.written = len(wrote)
            want = min(self.batch, trials - len(rows))
            fresh = self.choose(new, want)
            extra = self.from_space(want - len(fresh), round_, set(fresh)) if self.fill and len(fresh) < want else []
            if not fresh and not extra:
                idle += 1
                if idle >= max_idle_rounds:
                    result.stopped = f"no new script in {idle} rounds"
                    break
                round_ += 1
                continue
            idle = 0
            rows += self.measure(fresh + extra, round_, ["model"] * len(fresh) + ["design space"] * len(extra))
            bar.update(len(fresh) + len(extra))
            round_ += 1
        bar.close()
        best = None
        for r in rows:
            if r["latency_s"] and (best is None or r["latency_s"] < best["latency_s"]):
                best = r
            result.curve.append(best["latency_s"] if best else None)
        result.measured, result.correct = len(rows), sum(1 for r in rows if r["latency_s"])
        result.sampled = sum(1 for r in rows if r.get("source") == "design space")
        result.rounds = max((r["round"] for r in rows), default=0)
        if best:
            result.best_latency_s, result.baseline_s, result.best_script = best["latency_s"], best["baseline_s"], best["script"]
        result.seconds = time.perf_counter() - start
        files.write_json(self.work / "result.json", result.to_json())
        return result


def tune(kernel_path: str, target_spec, trials: int, model_dir: str, work_dir: str, batch: int = 8,
         timeout_s: float = 60.0, progress: bool = True, oversample: int = 1,
         cost_data: str | None = None, fill: bool = True) -> TuneResult:
    """`oversample` > 1: a cost model (pipeline.cost_model.for_target: pre-trained on
    `cost_data`, or the target's search campaign kept in git) picks what to measure among
    `oversample` times the batch."""
    from pipeline import models
    from pipeline.describe import DescribeError
    from pipeline.optimize import KernelError, load_kernel
    from pipeline.tvm_env import make_target

    if trials < 1:
        raise KernelError(f"--trials must be >= 1, got {trials}")
    check_cost_args(oversample, cost_data)
    make_target(target_spec)          # a bad target fails here, before the model loads
    mod = load_kernel(kernel_path)
    model, tok = models.load(model_dir)
    cost, source = make_cost_model(target_spec, oversample, cost_data, progress)
    try:
        tuner = Tuner(mod, target_spec, model, tok, work_dir, batch=batch, timeout_s=timeout_s,
                      cost_model=cost, oversample=oversample, fill=fill)
    except DescribeError as err:
        raise KernelError(f"{kernel_path}: {err}") from None
    result = tuner.run(trials, progress=progress)
    result.cost_data = source
    if result.best_script:
        files.write_text_atomic(Path(work_dir) / "best.script", result.best_script + "\n")
    return result


def make_cost_model(target_spec, oversample: int, cost_data: str | None, progress: bool):
    """(the cost model for a tune, its data source), or (None, "") when `oversample` is 1."""
    if oversample <= 1:
        return None, ""
    from pipeline import cost_model as cm

    return cm.for_target(target_spec, cost_data, progress=progress)


def check_cost_args(oversample: int, cost_data: str | None) -> None:
    """Bad --oversample / --cost-data fail before anything loads."""
    from pipeline import records
    from pipeline.optimize import KernelError

    if oversample < 1:
        raise KernelError(f"--oversample must be >= 1, got {oversample}")
    if cost_data is not None and not records.shard_dirs(cost_data):
        raise KernelError(f"--cost-data {cost_data}: not a search work folder (no shard-*/ databases in it)")


def main_summary(r: TuneResult, work_dir: str) -> str:
    if not r.best_latency_s:
        return f"tune: {r.measured} candidates measured, none correct; database in {work_dir}"
    return (f"tune: {r.measured} candidates ({r.correct} correct) in {r.rounds} rounds, {r.seconds:.0f} s; "
            f"best {r.best_latency_s * 1e6:.1f} us ({r.speedup:.2f}x the baseline) -> {work_dir}/best.script, "
            f"MetaSchedule database in {work_dir}" + (f" ({r.stopped})" if r.stopped else "")
            + (f"; {r.sampled} from the design space (rounds the model wrote too few new)" if r.sampled else "")
            + (f"; {r.written} written, a cost model pre-trained on {r.cost_data} chose what to measure"
               if r.cost_data else ""))
