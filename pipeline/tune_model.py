"""`little-dragon tune-model NETWORK.py --trials-per-task N`: model-guided tuning of a whole
Relax network.

The file is Python that builds a Relax IRModule (with `relax.frontend.nn`'s `export_tvm`, the
PyTorch exporter, or TVMScript) and leaves it in a module-level variable; it is code, so it is
loaded in a worker process with a timeout (like `optimize`'s kernel files). The network is
prepared the way MetaSchedule's Relax integration prepares it (library dispatch, LegalizeOps,
FuseOps, FuseTIR), its tuning tasks are extracted with `ms.relax_integration.extract_tasks`,
each task is tuned by `pipeline.tune.Tuner` (the model writes, the checker measures; N
candidates a task, its own JSONDatabase under `<work>/tasks/`), and the network is compiled
with all of them (`ms.relax_integration.compile_relax`: the tuned functions from the
databases, the rest as TVM would build them untuned). The result compares end-to-end latency
with the untuned build on the same random inputs, after checking both give the same outputs.

Resumable: each task's folder continues where it stopped; `result.json` is rewritten at the end.
"""

from __future__ import annotations

import runpy
import time
from pathlib import Path

import numpy as np

from pipeline import files
from pipeline.optimize import KernelError


def load_network(path: str | Path, timeout_s: float = 120.0):
    """The file's Relax IRModule, or KernelError (one line). Loaded in a worker process."""
    from pipeline.optimize import load_in_worker

    return load_in_worker(_load_json, path, timeout_s)


def _load_json(path: str) -> tuple[bool, str]:
    from pipeline.tvm_env import tvm

    try:
        return True, tvm.ir.save_json(load_network_here(path))
    except KernelError as err:
        return False, str(err)


def load_network_here(path: str | Path):
    from tvm import relax

    from pipeline.tvm_env import last_line, tvm

    path = Path(path)
    if not path.is_file() or path.suffix != ".py":
        raise KernelError(f"{path}: not a Python file (a file that builds a Relax IRModule)")
    try:
        namespace = runpy.run_path(str(path), run_name="__network__")
    except Exception as err:   # noqa: BLE001 - the user's code: any error is a one-line message
        raise KernelError(f"{path}: running it raised {type(err).__name__}: {last_line(err)}"[:500]) from None
    for value in namespace.values():
        if isinstance(value, tvm.IRModule) and any(isinstance(f, relax.Function) for f in value.functions.values()):
            entry_name(value)
            return value
    raise KernelError(f"{path}: defines no Relax IRModule (build one, e.g. with relax.frontend.nn's export_tvm)")


def entry_name(mod) -> str:
    """`main`, or the module's only Relax function."""
    from tvm import relax

    names = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    if "main" in names:
        return "main"
    if len(names) == 1:
        return names[0]
    raise KernelError(f"the module has Relax functions {sorted(names)} and none is `main`: name the entry `main`")


def prepared(mod, target):
    """The network as MetaSchedule's Relax integration sees it (`compile_relax`'s preparation),
    so that task keys match the databases at compile time."""
    from tvm import relax
    from tvm.relax import pipeline as relax_pipeline

    from pipeline.tvm_env import tvm

    try:
        dispatch = relax_pipeline.library_dispatch_passes(target)
    except (ValueError, AttributeError):
        dispatch = []
    seq = [*dispatch, relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
           relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    with target:
        return tvm.transform.Sequential(seq)(mod)


def extract_tasks(mod, target) -> list:
    from pipeline.tvm_env import ms

    return list(ms.relax_integration.extract_tasks(prepared(mod, target), target))


def compile_network(mod, target, database):
    from pipeline.tvm_env import ms

    return ms.relax_integration.compile_relax(database, mod, target, None)


def network_inputs(mod, seed: int = 0) -> list[np.ndarray]:
    """Random values for the entry function's parameters (inputs and weights)."""
    rng = np.random.default_rng(seed)
    fn = mod[entry_name(mod)]
    out = []
    for param in fn.params:
        ty = param.ty                       # relax TensorType (TVM 0.27): static shape and dtype
        shape = tuple(int(x) for x in ty.shape)
        out.append((rng.uniform(-1.0, 1.0, size=shape) / max(1.0, np.sqrt(shape[-1] if shape else 1))).astype(str(ty.dtype)))
    return out


def run_network(executable, mod, target, inputs, min_repeat_ms: int = 50) -> tuple[np.ndarray, float]:
    """(outputs of one call, median seconds per call)."""
    from tvm import relax

    from pipeline.measure import device_for
    from pipeline.tvm_env import tvm

    dev = device_for(target)
    vm = relax.VirtualMachine(executable, dev)
    name = entry_name(mod)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    out = vm[name](*args)
    first = out.numpy() if hasattr(out, "numpy") else np.concatenate([o.numpy().ravel() for o in out])
    timer = vm.time_evaluator(name, dev, number=3, repeat=5, min_repeat_ms=min_repeat_ms)
    return first, float(np.median(timer(*args).results))


def union(work_dirs: list[Path]):
    from pipeline.tvm_env import ms

    dbs = [ms.database.JSONDatabase(work_dir=str(d)) for d in work_dirs]
    return ms.database.UnionDatabase(*dbs) if dbs else ms.database.MemoryDatabase()


def end_to_end(mod, target, database, reference=None, seed: int = 0) -> dict:
    """Compile with `database`, run on the seeded inputs, time; `reference`: outputs to match."""
    inputs = network_inputs(mod, seed)
    start = time.perf_counter()
    executable = compile_network(mod, target, database)
    compile_s = time.perf_counter() - start
    out, latency = run_network(executable, mod, target, inputs)
    row = {"latency_s": latency, "compile_s": round(compile_s, 2), "outputs": out}
    if reference is not None:
        row["matches_untuned"] = bool(np.allclose(out, reference, rtol=1e-3, atol=1e-4))
    return row


def tune_model(path: str, target_spec, trials_per_task: int, model_dir: str | None, work_dir: str, batch: int = 8,
               timeout_s: float = 60.0, progress: bool = True, oversample: int = 1,
               cost_data: str | None = None, fill: bool = True, strategy: str = "model", focus: int = 16,
               params_path: str = "params.yaml") -> dict:
    """`oversample` > 1: one cost model for all tasks (as MetaSchedule shares one across a
    network's tasks) picks what each task measures among `oversample` times its batch.
    `strategy` "ms-cost": no language model; each task tuned by MetaSchedule's search ranked by
    the cost model pre-trained on the target's campaign (pipeline.tune_search), one model shared
    by the tasks; the network's end-to-end check stands for the per-kernel checks. "ms-rank": the
    same, the search ranked by pipeline.rank_model on that data."""
    from pipeline import tune_search
    from pipeline.describe import DescribeError
    from pipeline.tune import Tuner, check_cost_args, make_cost_model
    from pipeline.tvm_env import make_target
    from pipeline.verify import Checker

    search = strategy in ("ms-cost", "ms-rank")
    if search:
        tune_search.check_args(trials_per_task, batch, focus, cost_data, "--trials-per-task")
    elif trials_per_task < 1:
        raise KernelError(f"--trials-per-task must be >= 1, got {trials_per_task}")
    check_cost_args(oversample, cost_data)
    target = make_target(target_spec)          # a bad target fails here, before anything loads
    mod = load_network(path)
    tasks = extract_tasks(mod, target)
    if not tasks:
        raise KernelError(f"{path}: the network has no tuning task (no operator to schedule)")
    work = Path(work_dir)
    if search:
        from pipeline import cost_model

        model = tok = None
        cost, source = cost_model.for_target(target_spec, cost_data, progress=progress)
        sp = tune_search.search_params(params_path, batch)
    else:
        from pipeline import models

        model, tok = models.load(model_dir)
        cost, source = make_cost_model(target_spec, oversample, cost_data, progress)
    checker = Checker(timeout_s=timeout_s) if not search else None
    rows, dirs, start = [], [], time.perf_counter()
    for i, task in enumerate(tasks):
        folder = work / "tasks" / f"{i:02d}-{task.task_name}"
        if progress:
            print(f"tune-model: task {i + 1}/{len(tasks)} {task.task_name} (x{int(task.weight)})", flush=True)
        if search:
            r = tune_search.tune_kernel(task.dispatched[0], target_spec, trials_per_task, folder, cost, source, sp,
                                        focus, verify_top=0, progress=progress, ranker=strategy == "ms-rank")
            dirs.append(folder)
            rows.append({"task": task.task_name, "weight": int(task.weight),
                         **{k: v for k, v in r.to_json().items() if k not in ("curve", "best_script")}})
            continue
        try:
            tuner = Tuner(task.dispatched[0], target_spec, model, tok, folder, batch=batch, checker=checker,
                          cost_model=cost, oversample=oversample, fill=fill)
        except DescribeError as err:
            rows.append({"task": task.task_name, "weight": int(task.weight), "skipped": str(err)})
            continue
        r = tuner.run(trials_per_task, progress=progress)
        dirs.append(folder)
        rows.append({"task": task.task_name, "weight": int(task.weight), **{k: v for k, v in r.to_json().items()
                                                                             if k not in ("curve", "best_script")}})
    if checker is not None:
        checker.close()
    tune_s = time.perf_counter() - start
    untuned = end_to_end(mod, target, union([]))
    tuned = end_to_end(mod, target, union(dirs), reference=untuned["outputs"])
    result = {"network": str(path), "target": target_spec, "trials_per_task": trials_per_task, "tasks": rows,
              "measured": sum(r.get("measured", 0) for r in rows), "tune_seconds": round(tune_s, 1),
              "untuned_latency_s": untuned["latency_s"], "tuned_latency_s": tuned["latency_s"],
              "matches_untuned": tuned["matches_untuned"], "cost_data": source, "strategy": strategy,
              "speedup_vs_untuned": untuned["latency_s"] / tuned["latency_s"]}
    files.write_json(work / "result.json", result)
    return result


def main_summary(r: dict, work_dir: str) -> str:
    how = f" ({r['strategy']})" if r.get("strategy") in ("ms-cost", "ms-rank") else ""
    return (f"tune-model{how}: {len(r['tasks'])} tasks, {r['measured']} candidates in {r['tune_seconds']:.0f} s; "
            f"end to end {r['tuned_latency_s'] * 1e6:.1f} us against {r['untuned_latency_s'] * 1e6:.1f} us untuned "
            f"({r['speedup_vs_untuned']:.2f}x), outputs {'match' if r['matches_untuned'] else 'DIFFER'}; "
            f"databases in {work_dir}/tasks, {work_dir}/result.json")
