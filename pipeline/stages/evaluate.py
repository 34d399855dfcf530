"""Stage 6: gated evaluation and registration.

    little-dragon evaluate

On the held-out test workloads, on held-out catalog workloads that no stage trains on
(`catalog_workloads`, pipeline.heldout) and on a slice of TVM's te_workload suite (the external
benchmark, never trained on), for each model (SFT, RL): K scripts per construction prompt and
per refinement prompt, each verified and timed by the same checker (pipeline.verify, in worker
processes). MetaSchedule tunes every task in the same run, with the search stage's settings;
its candidates are re-timed by that same checker, so model and search share one timer.

Metrics (reports/metrics.json; top level = the candidate model, `models.<label>` = each):
per-attempt correctness with the failure breakdown, geometric-mean speedup over the baseline
(a task with no correct script has no speedup: it is counted apart), latency ratio to MetaSchedule's
best at the same number of measured candidates (K) and at the full budget, RL-vs-SFT wins,
time to schedule against the search time MetaSchedule needed to reach the same latency
(prorated by trial index over the tuning run's wall time). Every model is registered in MLflow;
`champion` moves only to a version that passes every gate.

An evaluation too long for one sitting (the GPU profile on a lent machine) runs in steps:
`evaluate --stop-after S` stops starting tasks after S seconds; with `archive_dir` set, every
finished MetaSchedule run (its database), its re-timed candidates and every model's results per
task are kept there (for git) and reused by the next step while their settings and model files
are the same; the metrics are written by the step that finds every task done. A step can run
one phase alone: `--metaschedule-only` (no model needed) or `--models-only` (the models on the
tasks whose MetaSchedule run is kept; on a GPU shared by several processes, generation holds the
device lock as the timings do, except while guided decoding makes its masks on the host).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from pipeline import cluster, device_lock, files, params as P, records
from pipeline.prompts import construction_prompt, refinement_prompt
from pipeline.describe import describe
from pipeline.prompts import source_script
from pipeline.reward import Measurer
from pipeline.verify import STAGES, Outcome
from pipeline.stats import geomean

DEFAULT_GATES = {"min_construction_correctness": 0.90, "min_refinement_correctness": 0.90,
                 "min_speedup": 1.0, "max_latency_ratio": 1.0}


METASCHEDULE_SEARCH_KEYS = ("population_size", "genetic_num_iters", "init_min_unmeasured", "max_fail_count")


@dataclass
class EvalParams:
    models: dict = field(default_factory=lambda: {"sft": "models/sft", "rl": "models/rl"})
    candidate: str = "rl"
    dataset_dir: str = "data/dataset"
    te_suite: list = field(default_factory=lambda: ["GMM:0", "SFM:0", "NRM:0"])
    # te_workload kernels that are also timed and tuned with MetaSchedule; the others are checked
    # for correctness only (built, run once, compared): timing them on 2 cores would take hours
    te_timed: list = field(default_factory=lambda: ["GMM:0", "SFM:0", "NRM:0"])
    attempts: int = 4
    refinement_prompts: int = 3
    metaschedule_trials: int | None = None    # full budget; None: search.trials_per_workload
    timeout_s: float = 60.0
    workers: int = 2
    seed: int = 0
    work_dir: str = "data/evaluate"
    metrics: str = "reports/metrics.json"
    report: str = "reports/evaluation.md"
    register: bool = True
    free_sampling: bool = True                # also sample the candidate freely, reported beside guided
    # Dask fan-out, one job per task (README: clusters): null = this process; "local" = a local
    # cluster of `cluster_workers` processes; or a scheduler's address (tcp://host:8786)
    cluster: str | None = None
    cluster_workers: int = 2
    # PyTorch (cuBLAS / cuDNN on the GPU) on the timed kernels it has a library call for
    # (pipeline.torch_baseline): the candidate's best construction latency over PyTorch's
    pytorch_baseline: bool = False
    catalog_workloads: int = 0                # held-out catalog workloads as extra timed tasks (pipeline.heldout)
    archive_dir: str | None = None            # an evaluation in steps: finished task results kept here (git)
    # up to this many tasks tuned together in one MetaSchedule run (round-robin, one cost model, as
    # its Relax integration tunes a network; their wall time shared equally); Dask jobs tune one each
    metaschedule_group: int = 1
    # re-time only MetaSchedule's `metaschedule_retime` fastest candidates by its own measurement,
    # plus its first `attempts` (MS@K, refinement sources); null: all of them. The others are
    # recorded as "untimed". Measured on 32 H200 tasks (python -m pipeline.bench.retime_top):
    # the checker's best of the 24 fastest was its best of all 64 on every task
    metaschedule_retime: int | None = None
    # the evaluation's MetaSchedule runs search with these settings where they differ from the
    # search stage's (keys: METASCHEDULE_SEARCH_KEYS): the campaign's search can change for speed
    # while the baseline, and the evaluation runs kept with its settings, stay as they were
    metaschedule_search: dict = field(default_factory=dict)
    # The candidate again, with a cost model choosing what to measure (pipeline.cost_model,
    # pre-trained on the target's search campaign): it writes `rerank_oversample` x `attempts`
    # scripts per construction prompt and the `attempts` best-predicted are checked. Reported as
    # "<candidate>+cm" beside the plain figures, construction only, never registered (the cost
    # model is not part of the model). 1: off
    rerank_oversample: int = 1
    # with the cost model, the K best-predicted scripts that compile are checked: a chosen one
    # that does not (pipeline.verify.compile_check: nvcc on a GPU-less machine, TVM's build where
    # the GPU is) gives its place to the next-ranked. TVM's CUDA code generation writes some
    # vectorized gathers nvcc rejects (8 values into a 4-lane `make_longlong4`): 7 of rl+cm's 96
    # construction scripts on the H200 (session 16); reports/gpu/compile_check.json
    rerank_compile_check: bool = False
    gates: dict = field(default_factory=lambda: dict(DEFAULT_GATES))

    def __post_init__(self):
        P.require(self.candidate in self.models, f"evaluate.candidate {self.candidate!r} is not in evaluate.models")
        P.require(self.attempts >= 1, "evaluate.attempts must be >= 1")
        P.require(self.catalog_workloads >= 0, "evaluate.catalog_workloads must be >= 0")
        P.require(self.metaschedule_group >= 1, "evaluate.metaschedule_group must be >= 1")
        P.require(self.rerank_oversample >= 1, "evaluate.rerank_oversample must be >= 1 (1: no cost model)")
        P.require(self.metaschedule_retime is None or self.metaschedule_retime >= 1,
                  "evaluate.metaschedule_retime must be >= 1 or null (all)")
        unknown = sorted(set(self.metaschedule_search) - set(METASCHEDULE_SEARCH_KEYS))
        P.require(not unknown, f"evaluate.metaschedule_search: unknown key(s) {unknown}; "
                               f"known: {list(METASCHEDULE_SEARCH_KEYS)}")
        P.require(all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                      for v in self.metaschedule_search.values()),
                  "evaluate.metaschedule_search: values must be integers >= 1")
        P.require(set(self.gates) == set(DEFAULT_GATES), f"evaluate.gates needs exactly {sorted(DEFAULT_GATES)}")
        cluster.check_address(self.cluster, "evaluate.cluster")
        for item in self.te_suite:
            name, _, idx = str(item).partition(":")
            P.require(idx.isdigit(), f"evaluate.te_suite entry {item!r} must be NAME:INDEX, e.g. GMM:0")


@dataclass
class Task:
    key: str
    source: str                      # "test" | "catalog" | "te_workload"
    mod: object
    timed: bool = True               # timed and tuned with MetaSchedule (speedup metrics), or correctness only
    prompt: str = ""
    refinements: list = field(default_factory=list)   # [(prompt, source script)]
    ms_scripts: list = field(default_factory=list)
    ms_outcomes: list = field(default_factory=list)
    ms_seconds: float = 0.0
    ms_done: bool = False                 # MetaSchedule finished on it (or raised: ms_error)
    ms_error: str | None = None


def _best(outcomes: list[Outcome]) -> Outcome | None:
    ok = [o for o in outcomes if o.correct and o.latency_s]
    return min(ok, key=lambda o: o.latency_s) if ok else None


def te_module(item: str):
    from tvm.s_tir.meta_schedule.testing import te_workload

    from pipeline.tvm_env import tvm

    name, _, idx = item.partition(":")
    return tvm.IRModule({"main": te_workload.create_te_workload(name, int(idx))})


def catalog_specs(p: EvalParams, sp, corpus: dict, specs: dict, target) -> list:
    """The held-out catalog workloads (pipeline.heldout: past the reach of the corpus whose
    params section is `corpus`, not searched), added to `specs` so the checker can build them."""
    if not p.catalog_workloads:
        return []
    from pipeline import heldout

    prefix = max((t["workloads"] for t in corpus.get("targets", [])), default=0)
    chosen = heldout.catalog_workloads(p.catalog_workloads, corpus.get("seed", 0), prefix, sp.families,
                                       sp.max_mflop, sp.max_elements, set(specs), target,
                                       cache=Path(p.archive_dir or p.work_dir) / "heldout.json")
    for spec in chosen:
        specs[spec.id] = spec.to_json()
    return chosen


def make_tasks(p: EvalParams, specs: dict, target, extra: list = ()) -> list[Task]:
    """Test workloads (with their dataset prompts), then the held-out catalog workloads `extra`
    (construction prompt here, refinement prompts from MetaSchedule's first candidates), then
    the te_workload kernels."""
    from pipeline.workloads import Spec, build

    rows = list(files.read_jsonl(Path(p.dataset_dir) / "test.jsonl"))
    if not rows:
        raise FileNotFoundError(f"no test examples in {p.dataset_dir}/test.jsonl: run `little-dragon data` first")
    tasks: dict[str, Task] = {}
    for r in rows:
        if r["workload"] not in tasks:
            tasks[r["workload"]] = Task(r["workload"], "test", build(Spec.from_json(specs[r["workload"]])))
        t = tasks[r["workload"]]
        if r["task"] == "construction":
            t.prompt = r["prompt"]
        elif len(t.refinements) < p.refinement_prompts and all(r["prompt"] != q for q, _ in t.refinements):
            t.refinements.append((r["prompt"], source_script(r["prompt"])))
    out = list(tasks.values())
    for spec in extra:
        mod = build(spec)
        out.append(Task(spec.id, "catalog", mod, True, construction_prompt(describe(mod), target.kind.name)))
    for item in p.te_suite:
        mod = te_module(item)
        out.append(Task(f"te:{item}", "te_workload", mod, item in p.te_timed,
                        construction_prompt(describe(mod), target.kind.name)))
    return out


def sampled_refinements(tasks: list[Task], measurer: Measurer, target, seed: int) -> None:
    """Untimed te_workload kernels get a refinement prompt too: its source is a script sampled
    from the kernel's design space (MetaSchedule's own random sampling), checked first."""
    from pipeline import codec
    from pipeline.space import SpaceError, sample_many

    for t in tasks:
        if t.source != "te_workload" or t.timed or t.refinements:
            continue
        try:
            schedules = sample_many(t.mod, target, 1, seed=seed)
        except SpaceError:
            continue
        for sch in schedules:
            script = codec.canonical_script(sch.trace)
            if measurer.measure([(t.key, script)], timed=False)[0].correct:
                t.refinements = [(refinement_prompt(describe(t.mod), target.kind.name, script, 1.0), script)]


def vs_pytorch(tasks: list[Task], res: dict, specs: dict, target, seed: int) -> dict:
    """Per timed kernel with a PyTorch call: PyTorch's latency (its output checked against
    the kernel's reference first) and the candidate's best construction latency over it."""
    from pipeline import torch_baseline, verify
    from pipeline.measure import is_gpu

    device = "cuda" if is_gpu(target) else "cpu"
    rows = []
    for t in tasks:
        spec = specs.get(t.key) if t.source in ("test", "catalog") else None
        if not t.timed or torch_baseline.for_kernel(t.key, spec) is None:
            continue
        reference = verify.reference(t.mod, target, seed)[0][-1]
        torch_s = torch_baseline.measure(t.mod, t.key, spec, reference, device, seed)
        best = _best(res[t.key]["construction"])
        rows.append({"task": t.key, "pytorch_s": torch_s["latency_s"], "error": torch_s["error"],
                     "model_s": best.latency_s if best else None,
                     "ratio": best.latency_s / torch_s["latency_s"] if best and torch_s["latency_s"] else None})
    return {"device": device, "tasks": len(rows), "latency_ratio": geomean([r["ratio"] for r in rows]),
            "at_or_below": sum(1 for r in rows if r["ratio"] and r["ratio"] <= 1.0), "per_task": rows}


def run_metaschedule(p: EvalParams, tasks: list[Task], measurer: Measurer, sp, target, trials: int, progress: bool,
                     deadline: float | None = None, tune_new: bool = True) -> None:
    """MetaSchedule on every timed task (`metaschedule_group` tasks to a run), its candidates
    re-timed by the evaluation's checker. With `archive_dir`, a finished run and its re-timed
    candidates are kept and reused. Past `deadline` no new run starts. `tune_new` False: only
    the kept runs are read back (and re-timed if they were not); the other tasks stay undone."""
    from pipeline import archive, metaschedule

    ms_settings = metaschedule.settings(target, trials, sp, p.metaschedule_group)
    for t in tasks:                       # a task whose run raised in an earlier step is not retried
        failed = _cache_read(p, t.key).get("metaschedule_failed")
        if t.timed and not t.ms_done and failed and failed["key"] == ms_settings:
            _ms_failed(p, t, failed["error"], ms_settings)
    todo = [t for t in tasks if t.timed and not t.ms_done]
    kept = Path(p.archive_dir) / "metaschedule" if p.archive_dir else None
    bar = tqdm(total=len(todo), desc="metaschedule", disable=not progress)
    for i in range(0, len(todo), p.metaschedule_group):
        if deadline is not None and time.time() > deadline:
            break
        group = todo[i:i + p.metaschedule_group]
        works = [Path(p.work_dir) / _dirname(t.key) for t in group]
        if kept is not None:
            for work in works:
                archive.restore(work, kept)
        if not tune_new:
            done = [metaschedule.finished(w, target, trials, sp, p.metaschedule_group) is not None for w in works]
            group, works = [t for t, d in zip(group, done) if d], [w for w, d in zip(works, done) if d]
            bar.update(len(done) - len(group))
            if not group:
                continue
        runs = _tune_safely(p, group, works, sp, target, trials, kept is not None)
        if kept is not None:       # every finished run kept before any re-timing (which a stop may cut)
            for work, tuned in zip(works, runs):
                if not isinstance(tuned, Exception):
                    archive.save(work, kept)
        for t, tuned in zip(group, runs):
            if isinstance(tuned, Exception):
                _ms_failed(p, t, f"{type(tuned).__name__}: {str(tuned).strip()[-500:]}", ms_settings)
            else:
                _retime(p, t, tuned, measurer, target, ms_settings)
            bar.update(1)
    bar.close()


def _tune_safely(p: EvalParams, group: list[Task], works: list[Path], sp, target, trials: int, reuse: bool) -> list:
    """MetaSchedule on a group of tasks; if TVM raises (seen on the H200: `IndexError` inside its
    task scheduler), each task again alone, so one bad kernel costs only itself: per task, its
    run or the exception it raised."""
    from pipeline import metaschedule

    def tune(ts: list[Task], ws: list[Path]) -> list:
        return metaschedule.tune_group([(t.key, t.mod, w) for t, w in zip(ts, ws)], target, trials, sp,
                                       p.metaschedule_group, reuse=reuse)

    try:
        return tune(group, works)
    except Exception as err:   # noqa: BLE001 - anything TVM raises: recorded, never fatal
        if len(group) == 1:
            return [err]
    out = []
    for t, w in zip(group, works):
        try:
            out += tune([t], [w])
        except Exception as err:   # noqa: BLE001
            out.append(err)
    return out


def _ms_failed(p: EvalParams, t: Task, error: str, ms_settings: dict) -> None:
    """MetaSchedule raised on this task: no candidates, the error kept (and not retried)."""
    t.ms_scripts, t.ms_outcomes, t.ms_done, t.ms_error = [], [], True, error
    _cache_update(p, t.key, "metaschedule_failed", {"key": ms_settings, "error": error})


def _retime(p: EvalParams, t: Task, tuned, measurer: Measurer, target, ms_settings: dict) -> None:
    """A finished MetaSchedule run's candidates as the evaluation's checker sees them (kept in
    the task's cache under the run's `ms_settings`), and the refinement prompts taken from them.
    With `metaschedule_retime` N, only the candidates `retime_selection` picks are re-timed; a
    cache of a full re-timing serves too, restricted to the same selection."""
    t.ms_scripts, t.ms_seconds, t.ms_done = tuned.scripts, tuned.seconds, True
    cache = _cache_read(p, t.key)
    # keyed by the run itself: a re-timing never serves another run of the same settings (a step
    # that tuned a kept task again had reused the old run's re-timing for the new candidates)
    full_key = {**ms_settings, "scripts": len(tuned.scripts), "run": tuned.run}
    ms_key = full_key if p.metaschedule_retime is None else {**full_key, "retime": p.metaschedule_retime}
    chosen = retime_selection(tuned.ms_latency_s, p.attempts, p.metaschedule_retime)
    if cache.get("metaschedule", {}).get("key") in (ms_key, full_key):
        outcomes = [_outcome(o) for o in cache["metaschedule"]["outcomes"]]
        t.ms_outcomes = [o if i in chosen or tuned.scripts[i] is None or o.stage == UNTIMED else _untimed(p)
                         for i, o in enumerate(outcomes)]
    else:
        pairs = [(t.key, s) for i, s in enumerate(tuned.scripts) if s is not None and i in chosen]
        timed = dict(zip([s for _, s in pairs], measurer.measure(pairs)))
        t.ms_outcomes = [Outcome("decode", "trace did not encode") if s is None
                         else timed[s] if i in chosen else _untimed(p) for i, s in enumerate(tuned.scripts)]
        _cache_update(p, t.key, "metaschedule", {"key": ms_key, "outcomes": [_json(o) for o in t.ms_outcomes]})
    if t.source in ("te_workload", "catalog"):   # no dataset prompts: refine MetaSchedule's own candidates
        t.refinements = _ms_refinements(t, target, p.attempts,
                                        1 if t.source == "te_workload" else p.refinement_prompts)


UNTIMED = "untimed"


def _untimed(p: EvalParams) -> Outcome:
    return Outcome(UNTIMED, f"not re-timed: outside MetaSchedule's {p.metaschedule_retime} fastest and its first "
                            f"{p.attempts}")


def retime_selection(ms_latency_s: list, first: int, fastest: int | None) -> set[int]:
    """Indices of the candidates to re-time: all (`fastest` None), else the first `first` and
    the `fastest` with the lowest latency by MetaSchedule's own measurement (failed: None)."""
    if fastest is None:
        return set(range(len(ms_latency_s)))
    ranked = sorted((lat, i) for i, lat in enumerate(ms_latency_s) if lat is not None)
    return set(range(min(first, len(ms_latency_s)))) | {i for _, i in ranked[:fastest]}


def _ms_refinements(t: Task, target, k: int, n: int) -> list[tuple[str, str]]:
    """The "somewhat optimized" scripts to refine: MetaSchedule's `n` fastest distinct correct
    candidates among its first `k`, as refinement prompts carrying their measured speedup."""
    ranked = sorted(((o, s) for o, s in zip(t.ms_outcomes[:k], t.ms_scripts) if o is not None and o.correct and o.latency_s),
                    key=lambda x: x[0].latency_s)
    out: list[tuple[str, str]] = []
    for o, script in ranked:
        if len(out) < n and all(script != s for _, s in out):
            out.append((refinement_prompt(describe(t.mod), target.kind.name, script, o.speedup or 1.0), script))
    return out

def _dirname(key: str) -> str:
    return key.replace(":", "_")


def _cache_path(p: EvalParams, key: str) -> Path:
    return Path(p.archive_dir) / "tasks" / f"{_dirname(key)}.json"


def _cache_read(p: EvalParams, key: str) -> dict:
    if not p.archive_dir or not _cache_path(p, key).exists():
        return {}
    import json

    return json.loads(_cache_path(p, key).read_text())


def _cache_update(p: EvalParams, key: str, field_name: str, value) -> None:
    """One task's kept results (MetaSchedule's re-timed candidates, each model's results),
    written atomically; nothing without `archive_dir`."""
    if not p.archive_dir:
        return
    entry = _cache_read(p, key)
    entry[field_name] = value
    _cache_path(p, key).parent.mkdir(parents=True, exist_ok=True)
    files.write_json(_cache_path(p, key), entry)


def _json(o: Outcome | None):
    return o.to_json() if o is not None else None


def _outcome(d: dict | None) -> Outcome | None:
    return Outcome(**d) if d is not None else None


def _result_json(r: dict) -> dict:
    return {**r, "construction": [_json(o) for o in r["construction"]],
            "refinement": [{**x, "source": _json(x["source"]), "attempts": [_json(o) for o in x["attempts"]]}
                           for x in r["refinement"]]}


def _result_from_json(d: dict) -> dict:
    return {**d, "construction": [_outcome(o) for o in d["construction"]],
            "refinement": [{**x, "source": _outcome(x["source"]), "attempts": [_outcome(o) for o in x["attempts"]]}
                           for x in d["refinement"]]}


def run_model(label: str, model_dir: str, tasks: list[Task], g, measurer: Measurer, target, seed: int,
              progress: bool, p: EvalParams | None = None, deadline: float | None = None,
              loaded: dict | None = None, pick: tuple | None = None) -> dict:
    """K scripts per construction prompt and per refinement prompt, each checked and timed.
    Several tasks' prompts are written in one batched generation (up to `g.batch_rows` rows),
    then all their scripts are checked side by side: one prompt at a time left an H200 idle
    between decoding steps (session 11: ~70 s a task). With `g.guided` (the default) every
    script comes from the kernel's design space. With `p.archive_dir`, a task's results kept
    for the same model files and settings are reused. `loaded`: model folder -> (model,
    tokenizer) already loaded, filled in here (one load for several calls). `pick` = (a cost
    model, K, compile check): of the `g.attempts` scripts written per prompt, the K it ranks best
    (that compile, with the check) are checked. With `deadline`, a batch holds only the tasks it
    is expected to finish before it (at the seconds a row of this model's kept results, then of
    its last batch here); the others wait for the next step."""
    from pipeline import models
    from pipeline.generate import sampling_key
    from pipeline.registry import model_digest

    mode = "guided" if g.guided else "free"
    gen = sampling_key(g)    # without how rows are grouped: results kept before a change of it count
    key = {"model": model_digest(model_dir) if p is not None and p.archive_dir else None, "generation": gen,
           "refinements": None, **(pick_key(pick[1], pick[2]) if pick else {})}
    out, todo = {}, []
    for t in tasks:
        kept = _cache_read(p, t.key).get(_model_field(label, mode, t)) if p is not None else None
        if kept is not None and kept["key"] == {**key, "refinements": [q for q, _ in t.refinements]}:
            out[t.key] = _result_from_json(kept["result"])
        else:
            todo.append(t)
    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"evaluate {label} ({mode})",
               disable=not progress)
    loaded = {} if loaded is None else loaded
    rate = _RATES.get((label, mode))
    if rate is None and todo and deadline is not None:   # the archive read only when a batch may be cut
        rate = kept_rate(p, label, mode, g.attempts)
    while todo:
        chunk = _task_chunks(todo, g.attempts, g.batch_rows)[0]
        if deadline is not None:
            chunk = _fitting(chunk, g.attempts, rate, deadline - time.time())
            if not chunk:
                break
        if model_dir not in loaded:
            loaded[model_dir] = models.load(model_dir)
        model, tok = loaded[model_dir]
        start = time.time()
        written = _write_and_check(model, tok, chunk, g, measurer, target, seed, pick)
        rate = _RATES[(label, mode)] = (time.time() - start) / sum(_rows(t, g.attempts) for t in chunk)
        todo = todo[len(chunk):]
        for t in chunk:
            result = out[t.key] = written[t.key]
            if p is not None:
                _cache_update(p, t.key, _model_field(label, mode, t),
                              {"key": {**key, "refinements": [q for q, _ in t.refinements]},
                               "result": _result_json(result)})
        bar.update(len(chunk))
    bar.close()
    return out


def _model_field(label: str, mode: str, t: Task) -> str:
    return f"model:{label}:{mode}:{'with' if t.refinements else 'no'}-refinements"


# seconds per (prompt, attempt) row of each (model label, mode)'s last batch in this process
_RATES: dict[tuple[str, str], float] = {}


def _rows(t: Task, attempts: int) -> int:
    return attempts * (1 + len(t.refinements))


def kept_rate(p: EvalParams | None, label: str, mode: str, attempts: int) -> float | None:
    """Seconds per (prompt, attempt) row of the model's results kept in the archive (their
    shares of generation, ranking and checking add up to their batches' time), or None. Rows of
    a full batch cost less than a small batch's (decoding steps are shared), so an estimate made
    from it for a smaller batch errs short; _fitting leaves a margin."""
    import json

    if p is None or not p.archive_dir or not (Path(p.archive_dir) / "tasks").is_dir():
        return None
    seconds, rows = 0.0, 0
    for path in (Path(p.archive_dir) / "tasks").glob("*.json"):
        for field_name, kept in json.loads(path.read_text()).items():
            r = kept.get("result", {}) if field_name.startswith(f"model:{label}:{mode}:") else {}
            if "generation_seconds" in r and "check_seconds" in r:
                seconds += r["generation_seconds"] + r["check_seconds"] + r.get("rank_seconds", 0.0)
                rows += attempts * (1 + len(r.get("refinement", [])))
    return seconds / rows if rows else None


def _fitting(chunk: list[Task], attempts: int, rate: float | None, left: float, margin: float = 1.25) -> list[Task]:
    """The first tasks of `chunk` whose batch is expected (at `rate` seconds a row, times `margin`)
    to end within `left` seconds: a step's stop then ends it between two batches instead of
    cutting one (GPU session 20 lost a 10-task batch that way). No estimate: the whole chunk
    while any time is left."""
    if left <= 0:
        return []
    if rate is None:
        return chunk
    fits, used = [], 0
    for t in chunk:
        used += _rows(t, attempts)
        if used * rate * margin > left:
            break
        fits.append(t)
    return fits


def _task_chunks(tasks: list[Task], attempts: int, rows: int) -> list[list[Task]]:
    """Consecutive tasks whose prompts x attempts fit `rows` (at least one task a chunk)."""
    out: list[list[Task]] = []
    used = rows
    for t in tasks:
        need = _rows(t, attempts)
        if used + need > rows:
            out.append([])
            used = 0
        out[-1].append(t)
        used += need
    return out


def _write_and_check(model, tok, tasks: list[Task], g, measurer: Measurer, target, seed: int,
                     pick: tuple | None = None) -> dict:
    """One batched generation for every prompt of `tasks`, then every script (and each
    refinement's source) checked, timed tasks timed. Per task: its results, with its share of
    the batch's generation time (by tokens) and checking time (by scripts) as its seconds."""
    from pipeline.generate import generate

    prompts = [(t, q) for t in tasks for q in [t.prompt] + [q for q, _ in t.refinements]]
    start = time.perf_counter()
    with device_lock.lease() as lease:   # on a shared GPU no timing runs beside the model's kernels
        w = generate(model, tok, [q for _, q in prompts], g, seed=seed, kernels=[(t.mod, target) for t, _ in prompts],
                     lease=lease)
    gen_s = time.perf_counter() - start
    start = time.perf_counter()
    written, rejected = _pick(w, [t.mod for t, _ in prompts], pick[0], pick[1],
                              _compiles(measurer) if pick[2] else None) if pick else (None, None)
    rank_s = time.perf_counter() - start
    start = time.perf_counter()
    checked: dict = {}
    for timed in (True, False):
        pairs = [(t.key, s) for (t, _), scripts in zip(prompts, w.scripts) if t.timed == timed for s in scripts]
        pairs += [(t.key, src) for t in tasks if t.timed == timed for _, src in t.refinements]
        checked.update(zip(pairs, measurer.measure(pairs, timed)))
    check_s = time.perf_counter() - start
    total_tokens = max(1, sum(w.prompt_tokens))
    total_scripts = max(1, sum(len(x) for x in w.scripts))
    out, i = {}, 0
    for t in tasks:
        n = 1 + len(t.refinements)
        idx = range(i, i + n)
        i += n
        outcomes = [_incomplete_fail([checked[(t.key, s)] for s in w.scripts[j]], w.complete[j]) for j in idx]
        tokens = sum(w.prompt_tokens[j] for j in idx)
        cons_tokens = w.prompt_tokens[idx[0]]
        out[t.key] = {"construction": outcomes[0],
                  "seconds": ((gen_s + rank_s) * cons_tokens / total_tokens
                              + check_s * len(w.scripts[idx[0]]) / total_scripts),
                  "refinement": [{"source": checked[(t.key, src)], "attempts": outcomes[1 + r], "complete": w.complete[j]}
                                 for r, ((_, src), j) in enumerate(zip(t.refinements, idx[1:]))],
                  "scripts": w.scripts[idx[0]], "complete": list(w.complete[idx[0]]), "tokens": tokens,
                  "generation_seconds": gen_s * tokens / total_tokens,
                  # of which (shares by tokens): masks, and postprocessing checks of complete scripts
                  "mask_seconds": w.mask_seconds * tokens / total_tokens,
                  "postprocess_seconds": w.postprocess_seconds * tokens / total_tokens,
                  "check_seconds": check_s * sum(len(w.scripts[j]) for j in idx) / total_scripts,
                  # ranking (and compile checks) by share of tokens; the chosen that did not compile
                  **({"rank_seconds": rank_s * tokens / total_tokens, "written": sum(written[j] for j in idx),
                      "compile_rejected": sum(rejected[j] for j in idx)} if pick else {}),
                  "retries": sum(w.prompt_retries[j] for j in idx)}
    return out


def pick_key(k: int, compile_check: bool) -> dict:
    """What a cost model's pick of `k` adds to the key of a kept result (results kept before the
    compile check existed carry no entry for it)."""
    return {"pick": k, **({"compile_check": True} if compile_check else {})}


def _pick(w, mods: list, cost, k: int, compiles=None) -> tuple[list[int], list[int]]:
    """Per prompt, keep in `w` the `k` scripts the cost model ranks best among the distinct
    complete ones written; with fewer than `k` of those, the rest are filled with what was written
    (repeats, incomplete ones: checked, failing as such). `compiles((mod, script) pairs) ->
    [bool]`: a chosen script that does not compile gives its place to the next-ranked (all
    prompts' checks side by side, round after round). Returns (how many each prompt had, how many
    chosen ones did not compile)."""
    written = [len(x) for x in w.scripts]
    order = []
    for j, mod in enumerate(mods):
        usable = list(dict.fromkeys(s for s, c in zip(w.scripts[j], w.complete[j]) if s and c))
        if compiles is not None:
            order.append(cost.pick(mod, usable, k, rest=True) if usable else [])
        else:
            order.append(cost.pick(mod, usable, k) if len(usable) > k else usable)
    picked, rejected = _compiling(order, mods, k, compiles) if compiles is not None else (order, [0] * len(mods))
    for j, best in enumerate(picked):
        scripts, complete = w.scripts[j], w.complete[j]
        chosen = [scripts.index(s) for s in best]
        chosen += [i for i in range(len(scripts)) if i not in chosen][: k - len(chosen)]
        w.scripts[j], w.complete[j] = [scripts[i] for i in chosen], [complete[i] for i in chosen]
    return written, rejected


def _compiling(order: list[list[str]], mods: list, k: int, compiles) -> tuple[list[list[str]], list[int]]:
    """Per prompt, the first `k` of its `order` that compile, and how many were tried and did not."""
    picked, rejected, pos = [[] for _ in mods], [0] * len(mods), [0] * len(mods)
    while True:
        batch = []
        for j in range(len(mods)):
            take = order[j][pos[j]:pos[j] + k - len(picked[j])]
            pos[j] += len(take)
            batch += [(j, s) for s in take]
        if not batch:
            return picked, rejected
        for (j, s), ok in zip(batch, compiles([(mods[j], s) for j, s in batch])):
            if ok:
                picked[j].append(s)
            else:
                rejected[j] += 1


def _compiles(measurer: Measurer):
    """(mod, script) pairs -> whether each compiles (decode, apply, postprocess, build, nvcc)."""
    return lambda pairs: [o.stage == "ok" for o in measurer.checker.compile_pairs(pairs, measurer.target_spec)]


def _incomplete_fail(outcomes: list[Outcome], complete: list) -> list[Outcome]:
    """A guided script that stopped before its sketch was complete (out of tokens) is a failure,
    never a correct short script. (Free scripts carry None: they are checked as written.)"""
    return [Outcome("decode", "incomplete: the script ended before every decision of its sketch was made")
            if c is False else o for o, c in zip(outcomes, complete)]


def decoding_figures(res: dict) -> dict:
    """Completeness (guided: every decision of the sketch made, then EOS), tokens, time, retries."""
    c = [x for r in res.values() for x in r["complete"]]
    rc = [x for r in res.values() for ref in r["refinement"] for x in ref["complete"]]
    tokens = sum(r["tokens"] for r in res.values())
    secs = sum(r["generation_seconds"] for r in res.values())
    known = [x for x in c + rc if x is not None]
    return {"complete_share": (sum(known) / len(known)) if known else None,
            "construction_complete": sum(bool(x) for x in c), "construction_attempts": len(c),
            "refinement_complete": sum(bool(x) for x in rc), "refinement_attempts": len(rc),
            "tokens": tokens, "generation_seconds": round(secs, 2),
            "tokens_per_second": round(tokens / secs, 1) if secs else None,
            # where the time went (results kept before session 12 lack the split: then None)
            **{k: (round(sum(r[k] for r in res.values()), 2) if all(k in r for r in res.values()) else None)
               for k in ("mask_seconds", "postprocess_seconds", "check_seconds")},
            "postproc_retries": sum(r["retries"] for r in res.values())}


def _baseline(outcomes: list[Outcome]) -> float | None:
    xs = [o.baseline_s for o in outcomes if o is not None and o.baseline_s]
    return statistics.median(xs) if xs else None


def model_metrics(res: dict, tasks: list[Task], K: int) -> dict:
    counts = {"construction": {s: 0 for s in STAGES}, "refinement": {s: 0 for s in STAGES}}
    per_task, c_speed, r_speed, r_src, ratio_k, ratio_full, tts = [], [], [], [], [], [], []
    no_correct = 0
    for t in tasks:
        r = res[t.key]
        for o in r["construction"]:
            counts["construction"][o.stage] += 1
        if not t.timed:     # correctness only (built, run once, compared)
            for x in r["refinement"]:
                for o in x["attempts"]:
                    counts["refinement"][o.stage] += 1
            per_task.append({"task": t.key, "source": t.source, "timed": False,
                             "correct_attempts": sum(o.correct for o in r["construction"]),
                             "attempts": len(r["construction"]),
                             "refinement_correct": sum(o.correct for x in r["refinement"] for o in x["attempts"]),
                             "refinement_attempts": sum(len(x["attempts"]) for x in r["refinement"])})
            continue
        every = r["construction"] + t.ms_outcomes + [a for x in r["refinement"] for a in x["attempts"]]
        base = _baseline(every)
        best = _best(r["construction"])
        # a kernel with no correct script has no speedup: it is counted apart, never as 1x
        speedup = (base / best.latency_s) if best and base else None
        if speedup:
            c_speed.append(speedup)
        else:
            no_correct += 1
        ms_k, ms_full = _best(t.ms_outcomes[:K]), _best(t.ms_outcomes)
        mine = best.latency_s if best else base
        if ms_k and mine:
            ratio_k.append(mine / ms_k.latency_s)
        if ms_full and mine:
            ratio_full.append(mine / ms_full.latency_s)
        reach = None
        if best:
            for i, o in enumerate(t.ms_outcomes):
                if o is not None and o.correct and o.latency_s and o.latency_s <= best.latency_s:
                    reach = t.ms_seconds * (i + 1) / max(1, len(t.ms_outcomes))
                    break
        tts.append({"task": t.key, "model_seconds": round(r["seconds"], 2), "model_correct": best is not None,
                    "metaschedule_seconds_to_same_latency": round(reach, 2) if reach else None,
                    "metaschedule_reached": reach is not None if best else None})
        for x in r["refinement"]:
            for o in x["attempts"]:
                counts["refinement"][o.stage] += 1
            rb, src = _best(x["attempts"]), x["source"]
            src_lat = src.latency_s if src.correct else None
            if rb and src_lat:
                r_src.append(src_lat / rb.latency_s)
            if rb and base:
                r_speed.append(base / rb.latency_s)
        per_task.append({"task": t.key, "source": t.source, "timed": True, "baseline_s": base,
                         "best_s": best.latency_s if best else None, "speedup": speedup,
                         "metaschedule_at_k_s": ms_k.latency_s if ms_k else None,
                         "metaschedule_full_s": ms_full.latency_s if ms_full else None,
                         "metaschedule_error": t.ms_error,
                         "correct_attempts": sum(o.correct for o in r["construction"]),
                         "attempts": len(r["construction"]),
                         "refinement_correct": sum(o.correct for x in r["refinement"] for o in x["attempts"]),
                         "refinement_attempts": sum(len(x["attempts"]) for x in r["refinement"])})

    def task_block(name, speeds, extra=None):
        c = counts[name]
        n = sum(c.values())
        return {"correctness": c["ok"] / n if n else None, "attempts": n,
                "failures_by_stage": {k: v for k, v in c.items() if k != "ok"},
                "speedup_geomean": geomean(speeds), **(extra or {})}

    reached = [x for x in tts if x["model_correct"]]
    return {
        "construction": task_block("construction", c_speed, {
            "tasks": len(tasks), "timed_tasks": sum(t.timed for t in tasks),
            "timed_tasks_without_correct_script": no_correct,
            "kernels_below_098": [x["task"] for x in per_task
                                  if x["attempts"] and x["correct_attempts"] / x["attempts"] < 0.98]}),
        "refinement": task_block("refinement", r_speed, {"prompts": len(r_src), "speedup_vs_source_geomean": geomean(r_src)}),
        "vs_metaschedule": {"latency_ratio": geomean(ratio_k), "latency_ratio_full_budget": geomean(ratio_full),
                            "equal_budget_candidates": K},
        "time_to_schedule": {"per_task": tts,
                             "model_seconds_mean": statistics.mean([x["model_seconds"] for x in tts]) if tts else None,
                             "metaschedule_reached": sum(bool(x["metaschedule_reached"]) for x in reached),
                             "tasks_with_correct_model_kernel": len(reached)},
        "per_task": per_task,
    }


def rl_vs_sft(rl: dict, sft: dict, tasks: list[Task]) -> dict:
    """Timed tasks where RL's best kernel is strictly faster than SFT's (untimed kernels have
    no latency to compare)."""
    cw = rw = prompts = 0
    tasks = [t for t in tasks if t.timed]
    for t in tasks:
        a, b = _best(rl[t.key]["construction"]), _best(sft[t.key]["construction"])
        cw += bool(a and (b is None or a.latency_s < b.latency_s))
        for x, y in zip(rl[t.key]["refinement"], sft[t.key]["refinement"]):
            prompts += 1
            a, b = _best(x["attempts"]), _best(y["attempts"])
            rw += bool(a and (b is None or a.latency_s < b.latency_s))
    return {"construction_wins": cw, "construction_tasks": len(tasks), "refinement_wins": rw,
            "refinement_prompts": prompts}


def gate(m: dict, gates: dict) -> dict:
    reasons = []

    def need(ok, msg):
        if not ok:
            reasons.append(msg)

    cc, rc = m["construction"]["correctness"], m["refinement"]["correctness"]
    sp, lr = m["construction"]["speedup_geomean"], m["vs_metaschedule"]["latency_ratio"]
    need(cc is not None and cc >= gates["min_construction_correctness"],
         f"construction correctness {cc} < {gates['min_construction_correctness']}")
    need(rc is not None and rc >= gates["min_refinement_correctness"],
         f"refinement correctness {rc} < {gates['min_refinement_correctness']}")
    need(sp is not None and sp > gates["min_speedup"], f"construction speedup {sp} is not above {gates['min_speedup']}")
    rs = m["refinement"]["speedup_geomean"]
    need(rs is None or rs > gates["min_speedup"], f"refinement speedup {rs} is not above {gates['min_speedup']}")
    need(lr is not None and lr <= gates["max_latency_ratio"],
         f"latency ratio to MetaSchedule at equal budget {lr} > {gates['max_latency_ratio']}")
    return {"passed": not reasons, "reasons": reasons}


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def speedup_plot(per_model: dict, candidate: str, attempts: int, trials: int, path: Path | str,
                 title: str = "") -> str | None:
    """Speedup over the baseline per task (log scale): each model's best of K beside MetaSchedule's
    best of its first K and of its whole run, tasks in the order of the candidate's speedup (one
    column a task: readable at 85 tasks, where grouped bars are not)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def ratio(a, b):
        return a / b if a and b else None

    rows = sorted((t for t in per_model[candidate]["per_task"] if t.get("timed", True) and t.get("baseline_s")),
                  key=lambda t: t.get("speedup") or 0)
    if not rows:
        return None
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(rows) + 2), 4.2))
    ax.plot(x, [ratio(t["baseline_s"], t.get("metaschedule_full_s")) for t in rows], "k_", ms=9,
            label=f"MetaSchedule@{trials}")
    ax.plot(x, [ratio(t["baseline_s"], t.get("metaschedule_at_k_s")) for t in rows], "x", color="gray",
            label=f"MetaSchedule@{attempts}")
    for label, res in per_model.items():
        by_task = {t["task"]: t.get("speedup") for t in res["per_task"]}
        ax.plot(x, [by_task.get(t["task"]) for t in rows], "o", ms=4, alpha=0.8, label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(list(x), [t["task"] for t in rows], rotation=90, fontsize=6)
    ax.set_ylabel("speedup over the baseline (best of K)")
    ax.set_title(title or f"per task, in the order of {candidate}'s speedup; no point: no correct script", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _plots(metrics: dict, labels: list[str], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speed = speedup_plot(metrics["models"], metrics["candidate"],
                         metrics["attempts"], metrics["metaschedule_trials"], out_dir / "eval_speedup.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    bars = [(f"{label}\n{task}", metrics["models"][label][task]) for label in labels
            for task in ("construction", "refinement")]
    bottom = [0.0] * len(bars)
    for stage in STAGES:
        share = []
        for _, m in bars:
            n = m["attempts"] or 1
            ok_n = (m["correctness"] or 0) * m["attempts"]     # None: no attempts (no refinement source)
            share.append((ok_n if stage == "ok" else m["failures_by_stage"][stage]) / n)
        ax.bar(range(len(bars)), share, bottom=bottom, label=stage)
        bottom = [a + b for a, b in zip(bottom, share)]
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("share of attempts")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    corr = str(out_dir / "eval_correctness.png")
    fig.savefig(corr, dpi=100)
    plt.close(fig)
    return [x for x in (speed, corr) if x]


def write_markdown(metrics: dict, path: str) -> None:
    lines = ["# Evaluation", "", f"Candidate: **{metrics['candidate']}**. Gate: "
             f"**{'passed' if metrics['gate']['passed'] else 'failed'}**"
             + ("" if metrics["gate"]["passed"] else " - " + "; ".join(metrics["gate"]["reasons"])), "",
             f"K = {metrics['attempts']} attempts per prompt; MetaSchedule budget {metrics['metaschedule_trials']} "
             "trials per task, tuned in this run, candidates re-timed by the same checker"
             + ("." if metrics.get("metaschedule_retimed", "all") == "all" else
                f" (its {metrics['metaschedule_retimed']} fastest by its own timing and its first K).") + "",
             "| model | construction correctness | refinement correctness | construction speedup | "
             "refinement speedup | vs source | latency / MS@K | latency / MS full |", "|---|---|---|---|---|---|---|---|"]
    for label, m in metrics["models"].items():
        lines.append(f"| {label} | {_fmt(m['construction']['correctness'])} | {_fmt(m['refinement']['correctness'])} | "
                     f"{_fmt(m['construction']['speedup_geomean'])} | {_fmt(m['refinement']['speedup_geomean'])} | "
                     f"{_fmt(m['refinement']['speedup_vs_source_geomean'])} | {_fmt(m['vs_metaschedule']['latency_ratio'])} | "
                     f"{_fmt(m['vs_metaschedule']['latency_ratio_full_budget'])} |")
    lines += ["", "## Decoding", "", "| model | mode | complete scripts | postproc retries | tokens | tokens/s | "
              "generation s | of which masks s | of which postprocessing s | checking s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for label, m in metrics["models"].items():
        d = m.get("decoding", {})
        lines.append(f"| {label} | {d.get('mode')} | {d.get('construction_complete', 0) + d.get('refinement_complete', 0)}/"
                     f"{d.get('construction_attempts', 0) + d.get('refinement_attempts', 0)} | {d.get('postproc_retries')} | "
                     f"{d.get('tokens')} | {d.get('tokens_per_second')} | {d.get('generation_seconds')} | "
                     f"{d.get('mask_seconds')} | {d.get('postprocess_seconds')} | {d.get('check_seconds')} |")
    for label, m in metrics["models"].items():
        if m.get("rerank"):
            lines += ["", f"{label}: the candidate with a cost model (pipeline.cost_model, pre-trained on the target's "
                      f"search campaign) checking the K best-predicted of {m['rerank']['written_per_prompt']} scripts "
                      "written per construction prompt"
                      + (f" that compile ({m['rerank']['compile_rejected']} best-predicted ones did not and gave their "
                         "place to the next)" if m["rerank"].get("compile_check") else "")
                      + "; construction only, not gated, not registered."]
    fs = metrics.get("free_sampling")
    if fs:
        lines += ["", f"Free sampling ({fs['model']}, the same construction prompts, same checker): correctness "
                  f"{_fmt(fs['construction']['correctness'])} (failures {fs['construction']['failures_by_stage']}); "
                  f"{fs['decoding']['tokens_per_second']} tokens/s. Guided vs free at equal tokens: "
                  "`python -m pipeline.bench.guided` (reports/guided.json)."]
    if "rl_vs_sft" in metrics:
        r = metrics["rl_vs_sft"]
        lines += ["", f"RL vs SFT: RL's best kernel faster on {r['construction_wins']} of {r['construction_tasks']} "
                  f"construction tasks and {r['refinement_wins']} of {r['refinement_prompts']} refinement prompts."]
    lines += ["", "## Per task (candidate)", "", "Untimed kernels are checked for correctness only (built, run once, "
              "compared with the unscheduled build).", "",
              "| task | set | baseline s | model best s | speedup | MS@K s | MS full s | "
              "construction correct | refinement correct |", "|---|---|---|---|---|---|---|---|---|"]
    for t in metrics["models"][metrics["candidate"]]["per_task"]:
        lines.append(f"| {t['task']} | {t['source']} | {_fmt(t.get('baseline_s'), '.3g')} | {_fmt(t.get('best_s'), '.3g')} | "
                     f"{_fmt(t.get('speedup'))} | {_fmt(t.get('metaschedule_at_k_s'), '.3g')} | "
                     f"{_fmt(t.get('metaschedule_full_s'), '.3g')} | {t['correct_attempts']}/{t['attempts']} | "
                     f"{t['refinement_correct']}/{t['refinement_attempts']} |")
    lines += ["", "## Time to schedule (candidate)", "", "| task | model s | MetaSchedule s to the same latency |",
              "|---|---|---|"]
    for x in metrics["models"][metrics["candidate"]]["time_to_schedule"]["per_task"]:
        ms = ("no correct model kernel" if not x["model_correct"] else
              _fmt(x["metaschedule_seconds_to_same_latency"], ".1f") if x["metaschedule_reached"] else "not reached")
        lines.append(f"| {x['task']} | {x['model_seconds']:.1f} | {ms} |")
    if metrics.get("registry"):
        lines += ["", "## Registry", ""]
        for r in metrics["registry"]["versions"]:
            lines.append(f"- {r['label']}: version {r['version']} (run {r['run_id']}), gate "
                         f"{'passed' if r['gate']['passed'] else 'failed'}")
        lines.append(f"- champion: {metrics['registry']['champion']}")
    files.write_text_atomic(path, "\n".join(lines) + "\n")


# Every model writes for this many tasks before the next ones: a step cut by its stop leaves every
# model's results on the same tasks (RL vs SFT comparable as the evaluation goes, evaluate --interim)
MODELS_GROUP = 16


def evaluate_tasks(p: EvalParams, tasks: list[Task], labels: list[str], g, measurer: Measurer, sp, target,
                   trials: int, free_on: bool, progress: bool, deadline: float | None = None,
                   tune_new: bool = True, spent: dict | None = None) -> tuple[dict, dict | None]:
    """MetaSchedule, then every model in `labels` (none: MetaSchedule only), on `tasks` in this
    process with one checker: (results per model label, the candidate's free-sampling results or
    None). The models write for the tasks whose MetaSchedule run is done (its refinement prompts
    come from it). Past `deadline` no new task is started, nor a model's batch expected to end
    past it: the results then lack some tasks (see `missing`). `tune_new` False: no MetaSchedule
    run is started, only kept ones are read.
    `spent`: seconds per phase are added to it (MetaSchedule, each label, the cost model)."""
    spent = {} if spent is None else spent
    clock = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        spent[phase] = spent.get(phase, 0.0) + now - clock
        clock = now

    for t in tasks:
        measurer.add(t.key, t.mod)
    run_metaschedule(p, tasks, measurer, sp, target, trials, progress, deadline, tune_new)
    lap("metaschedule")
    tasks = [t for t in tasks if t.ms_done or not t.timed]
    if not labels or not tasks:
        return {label: {} for label in labels}, ({} if free_on and labels else None)
    sampled_refinements(tasks, measurer, target, p.seed)
    lap("refinement prompts")
    rerank = rerank_label(p) if labels else None
    results: dict = {label: {} for label in labels + ([rerank] if rerank else [])}
    free: dict | None = {} if free_on else None
    loaded: dict = {}          # each model loaded once, kept for every group
    cost = None
    for i in range(0, len(tasks), MODELS_GROUP):
        group = tasks[i:i + MODELS_GROUP]
        for label in labels:
            results[label].update(run_model(label, p.models[label], group, g, measurer, target, p.seed, progress, p,
                                            deadline, loaded=loaded))
            lap(label)
        if free is not None:   # construction prompts only: free scripts rarely end, so they cost max_new_tokens each
            constructions = [replace(t, refinements=[]) for t in group]
            free.update(run_model(p.candidate, p.models[p.candidate], constructions, replace(g, guided=False),
                                  measurer, target, p.seed, progress, p, deadline, loaded=loaded))
            lap("free")
        if rerank:
            if cost is None:
                from pipeline import cost_model

                cost = cost_model.for_target(target, progress=progress)[0]
                lap("cost model")
            constructions = [replace(t, refinements=[]) for t in group]
            results[rerank].update(run_model(rerank, p.models[p.candidate], constructions,
                                             replace(g, attempts=g.attempts * p.rerank_oversample), measurer, target,
                                             p.seed, progress, p, deadline, loaded=loaded,
                                             pick=(cost, g.attempts, p.rerank_compile_check)))
            lap(rerank)
    return results, free


def _spent_line(spent: dict) -> str:
    """'set-up 12 s, metaschedule 40 s, sft 130 s, ...': where a step's time went."""
    return ", ".join(f"{k} {v:.0f} s" for k, v in spent.items() if v >= 0.5) or "nothing timed"


def rerank_label(p: EvalParams) -> str | None:
    """The label of the candidate with a cost model choosing what to measure (None: off)."""
    return f"{p.candidate}+cm" if p.rerank_oversample > 1 else None


def missing(tasks: list[Task], results: dict, free: dict | None) -> dict:
    """What an evaluation stopped by its deadline has left: tasks without MetaSchedule, and per
    model label the tasks without results."""
    out = {"metaschedule": [t.key for t in tasks if t.timed and not t.ms_done]}
    for label, res in {**results, **({"free": free} if free is not None else {})}.items():
        left = [t.key for t in tasks if t.key not in res]
        if left:
            out[label] = left
    return {k: v for k, v in out.items() if v}


def _task_job(params_path: str, key: str, labels: list[str], free_on: bool, extra: list | None = None,
              deadline: float | None = None, tune_new: bool = True) -> dict:
    """One task on a Dask worker: the whole in-process evaluation of that task (its own
    checker: MetaSchedule's candidates and every model's are timed by the same one). A job
    that starts past `deadline` (--stop-after, by the worker's clock) leaves its task."""
    if deadline is not None and time.time() > deadline:
        return {"key": key, "skipped": True}
    p, sp, g, target_spec, target, _ = _settings(params_path)
    p = replace(p, metaschedule_group=1)      # a job is one task
    measurer = Measurer(records.workload_entries(sp.work_dir), target_spec, p.timeout_s, p.workers)
    from pipeline.workloads import Spec

    extra_specs = [Spec.from_json(e) for e in extra or []]
    measurer.specs.update({e.id: e.to_json() for e in extra_specs})
    task = next(t for t in make_tasks(p, measurer.specs, target, extra_specs) if t.key == key)
    results, free = evaluate_tasks(p, [task], labels, g, measurer, sp, target,
                                   p.metaschedule_trials or sp.trials_per_workload, free_on, progress=False,
                                   tune_new=tune_new)
    measurer.checker.close()
    return {"key": key, "ms_scripts": task.ms_scripts, "ms_outcomes": task.ms_outcomes, "ms_seconds": task.ms_seconds,
            "ms_done": task.ms_done, "ms_error": task.ms_error,
            "refinements": task.refinements,
            "results": {label: res[key] for label, res in results.items() if key in res},
            "free": free.get(key) if free else None}


def evaluate_on_cluster(params_path: str, p: EvalParams, tasks: list[Task], labels: list[str], free_on: bool,
                        progress: bool, extra: list = (), deadline: float | None = None,
                        tune_new: bool = True) -> tuple[dict, dict | None]:
    """evaluate_tasks with one Dask job per task (`evaluate.cluster`: "local" or a scheduler's
    address); the tasks get MetaSchedule's results and refinement prompts back from the jobs.
    A job whose worker is lost runs again on another worker."""
    bar = tqdm(total=len(tasks), desc="evaluate tasks", unit="task", disable=not progress)
    extra_json = [e.to_json() for e in extra]
    done = cluster.run(_task_job, [(params_path, t.key, labels, free_on, extra_json, deadline, tune_new) for t in tasks],
                       address=p.cluster, workers=p.cluster_workers, on_result=lambda _: bar.update(1))
    bar.close()
    by_key = {d["key"]: d for d in done}
    results: dict = {label: {} for label in labels}
    free: dict | None = {} if free_on else None
    for t in tasks:
        d = by_key[t.key]
        if d.get("skipped"):        # left for the next step: `missing` lists it
            continue
        t.ms_scripts, t.ms_outcomes, t.ms_seconds, t.refinements = (d["ms_scripts"], d["ms_outcomes"],
                                                                   d["ms_seconds"], d["refinements"])
        t.ms_done, t.ms_error = d["ms_done"], d["ms_error"]
        for label, r in d["results"].items():       # none where MetaSchedule's run is not done yet
            results.setdefault(label, {})[t.key] = r
        if free is not None and d["free"] is not None:
            free[t.key] = d["free"]
    return results, free


def _settings(params_path: str):
    """(evaluate params, search params, generation params, target spec, target, the corpus
    section) from the file; the search params with `evaluate.metaschedule_search` applied."""
    import yaml

    from pipeline.generate import GenerationParams
    from pipeline.stages.search import SearchParams
    from pipeline.tvm_env import make_target

    p = P.load("evaluate", EvalParams, params_path)
    raw = yaml.safe_load(Path(params_path).read_text())
    sp = replace(P.from_dict(SearchParams, raw["search"], "search"), **p.metaschedule_search)
    g = P.from_dict(GenerationParams, {**raw.get("sft", {}).get("generation", {}), "attempts": p.attempts},
                    "sft.generation")
    target_spec = raw["search"]["target"]
    return p, sp, g, target_spec, make_target(target_spec), raw.get("corpus") or {}


def _check_model_dir(label: str, model_dir: str) -> None:
    from pipeline import models

    try:
        models.check(model_dir)
    except models.ModelError as err:
        raise models.ModelError(f"evaluate.models.{label}: {err}") from None


def main(params_path: str = "params.yaml", progress: bool = True, stop_after: float | None = None,
         part: tuple[int, int] | None = None, metaschedule_only: bool = False, models_only: bool = False) -> dict:
    """The whole gated evaluation. In steps (`evaluate.archive_dir`): `stop_after` starts no new
    task after that many seconds; `part` = (i, n) evaluates only every n-th task from the i-th
    (one process per GPU, sharing the archive); `metaschedule_only` runs the baseline phase alone
    (no model needed); `models_only` the models' phase alone, on the tasks whose MetaSchedule run
    is kept. Metrics, report and registry come only from a run over every task."""
    p, sp, g, target_spec, target, corpus = _settings(params_path)
    if metaschedule_only and models_only:
        raise P.ParamsError("evaluate: --metaschedule-only and --models-only exclude each other: choose one")
    labels = [] if metaschedule_only else [label for label, d in p.models.items() if Path(d).exists()]
    if not metaschedule_only and p.candidate not in labels:
        raise FileNotFoundError(f"candidate model {p.models[p.candidate]} does not exist: train it first")
    for label in labels:     # before any setup: a folder that arrived empty fails at once, not minutes later
        _check_model_dir(label, p.models[label])
    if (part or metaschedule_only or models_only) and not p.archive_dir:
        raise P.ParamsError("evaluate --part / --metaschedule-only / --models-only keep their work in "
                            "evaluate.archive_dir: set it")
    if p.archive_dir and target.kind.name == "cuda":   # H100 and H200 timings never mix in one archive
        from pipeline import archive

        try:
            archive.check_device(Path(p.archive_dir))
        except archive.DeviceMismatch as err:
            raise P.ParamsError(f"evaluate.archive_dir: {err}") from None
    trials = p.metaschedule_trials or sp.trials_per_workload
    start = time.perf_counter()
    measurer = Measurer(records.workload_entries(sp.work_dir), target_spec, p.timeout_s, p.workers)
    extra = catalog_specs(p, sp, corpus, measurer.specs, target)
    tasks = make_tasks(p, measurer.specs, target, extra)
    spent = {"set-up": time.perf_counter() - start}
    if part:
        tasks = tasks[part[0]::part[1]]
    free_on = g.guided and p.free_sampling and bool(labels)
    deadline = time.time() + stop_after if stop_after else None
    if p.cluster:
        results, free = evaluate_on_cluster(params_path, p, tasks, labels, free_on, progress, extra, deadline,
                                            tune_new=not models_only)
    else:
        results, free = evaluate_tasks(p, tasks, labels, g, measurer, sp, target, trials, free_on, progress, deadline,
                                       tune_new=not models_only, spent=spent)
    left = missing(tasks, results, free)
    scope = f"part {part[0]}/{part[1]}: " if part else ""
    if left:
        print(f"evaluate: {scope}stopped after {time.perf_counter() - start:.0f} s with work left ("
              + ", ".join(f"{k}: {len(v)} of {len(tasks)} tasks" for k, v in left.items())
              + f"); finished tasks are kept in {p.archive_dir or '(nowhere: set evaluate.archive_dir)'}; "
              f"run it again to continue. Time: {_spent_line(spent)}")
        return {"incomplete": left}
    if part or metaschedule_only or models_only:
        done = "MetaSchedule" if metaschedule_only else "every model"
        print(f"evaluate: {scope}{done} done on its {len(tasks)} tasks in {time.perf_counter() - start:.0f} s "
              f"(kept in {p.archive_dir}); run `evaluate` over all tasks for the metrics. Time: {_spent_line(spent)}")
        return {"incomplete": {}, "tasks": [t.key for t in tasks]}
    per_model = {label: model_metrics(results[label], tasks, p.attempts) for label in labels}
    constructions = [replace(t, refinements=[]) for t in tasks]
    rerank = rerank_label(p) if labels else None
    if rerank:      # construction only; its gate is shown, never used to register or promote
        per_model[rerank] = {**model_metrics(results[rerank], constructions, p.attempts),
                             "rerank": {"oversample": p.rerank_oversample, "written_per_prompt": p.attempts * p.rerank_oversample,
                                        "compile_check": p.rerank_compile_check,
                                        "compile_rejected": sum(r.get("compile_rejected", 0) for r in results[rerank].values())}}
    for label, m in per_model.items():
        m["gate"] = gate(m, p.gates) if label != rerank else {"passed": None, "reasons": ["construction only: not gated"]}
        m["decoding"] = {"mode": "guided" if g.guided else "free", **decoding_figures(results[label])}
    # The model's own validity, beside the guided figures: the candidate sampled freely.
    free_sampling = None
    if free_on:
        fm = model_metrics(free, constructions, p.attempts)
        free_sampling = {"model": p.candidate, "construction": {kk: fm["construction"][kk] for kk in
                                                                ("correctness", "attempts", "failures_by_stage")},
                         "decoding": decoding_figures(free)}
    cand = per_model[p.candidate]
    metrics = {"candidate": p.candidate, "attempts": p.attempts, "metaschedule_trials": trials,
               # re-timed by the checker: MetaSchedule's N fastest by its own timing + its first K, or all
               "metaschedule_retimed": p.metaschedule_retime or "all",
               "tasks": {"test": sum(t.source == "test" for t in tasks),
                         "catalog": sum(t.source == "catalog" for t in tasks),
                         "te_workload": sum(t.source == "te_workload" for t in tasks)},
               **{k: cand[k] for k in ("construction", "refinement", "vs_metaschedule")},
               "gate": cand["gate"], "gates": p.gates, "decoding": cand["decoding"],
               "free_sampling": free_sampling, "models": per_model,
               "samples": {label: {t.key: results[label][t.key]["scripts"][:2] for t in tasks} for label in labels}}
    if "rl" in results and "sft" in results:
        metrics["rl_vs_sft"] = rl_vs_sft(results["rl"], results["sft"], tasks)
    if p.pytorch_baseline:
        metrics["vs_pytorch"] = vs_pytorch(tasks, results[p.candidate], measurer.specs, target, p.seed)
    metrics["seconds"] = round(time.perf_counter() - start, 1)
    metrics["seconds_by_phase"] = {k: round(v, 1) for k, v in spent.items()}
    plots = _plots(metrics, labels, Path(p.metrics).parent)
    if p.register:
        metrics["registry"] = register_all(p, metrics, labels, plots)
    files.write_json(p.metrics, metrics)
    write_markdown(metrics, p.report)
    c = metrics["construction"]
    print(f"evaluate: {p.candidate}: construction correctness {_fmt(c['correctness'])}, refinement "
          f"{_fmt(metrics['refinement']['correctness'])}, speedup {_fmt(c['speedup_geomean'])}, latency/MS@K "
          f"{_fmt(metrics['vs_metaschedule']['latency_ratio'])}; gate {'passed' if metrics['gate']['passed'] else 'failed'}"
          f" ({'; '.join(metrics['gate']['reasons'])}) in {metrics['seconds']:.0f} s -> {p.metrics}, {p.report}")
    return metrics


def _flat(m: dict) -> dict:
    out = {}
    for k in ("construction", "refinement", "vs_metaschedule"):
        for kk, v in m[k].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"{k}.{kk}"] = v
    return out


def training_curves(report: Path) -> list[tuple[str, int, float]]:
    """The training curves a stage report holds: SFT loss per step, RL reward per step."""
    import json

    if not report.exists():
        return []
    r = json.loads(report.read_text())
    curves = [(f"{phase}_loss", step, loss) for phase, step, loss in r.get("history", [])]
    for row in r.get("per_step", []):
        curves += [(f"rl_{k}", row["step"], row[k]) for k in ("reward", "correctness", "speed", "correct_share")]
    return curves


def register_all(p: EvalParams, metrics: dict, labels: list[str], plots: list[str]) -> dict:
    """Register every evaluated model; move `champion` to the passing one with the best
    construction speedup (if any passed). A failing version is tagged with its reasons."""
    from pipeline import registry

    versions = []
    for label in labels:
        m = metrics["models"][label]
        report = Path(p.metrics).with_name(f"{label}.json")
        curves = training_curves(report)
        versions.append(registry.register(label, p.models[label], {"model_label": label, "model_dir": p.models[label],
                                          "attempts": p.attempts, "gates": p.gates}, _flat(m), curves,
                                          [*plots, str(report)], m["gate"]))
    passing = [v for v in versions if v["gate"]["passed"]]
    if passing:
        best = max(passing, key=lambda v: metrics["models"][v["label"]]["construction"]["speedup_geomean"] or 0)
        registry.promote(best["version"])
    champ = registry.champion()
    return {"versions": versions, "champion": f"version {champ['version']}" if champ else "none (no version passed)"}
