"""`little-dragon optimize KERNEL`: a user's kernel in, the best *verified* script out.

KERNEL is a TVMScript file holding a PrimFunc (or an IRModule with one), or a Python file
that builds one (a PrimFunc or IRModule variable, or TE tensors passed to
`te.create_prim_func`). The model writes K scripts; each is decoded, applied, postprocessed,
built, run, compared with the unscheduled kernel and timed (pipeline.verify, in a worker
process). The best correct one is printed and written with its speedup and the scheduled
TVMScript. An unverified script is never returned.
"""

from __future__ import annotations

import json
import runpy
import time
from pathlib import Path

from pipeline import files
from pipeline.verify import STAGES


class KernelError(ValueError):
    """A kernel file that cannot be used, with the reason in one line."""


def _as_module(obj):
    from pipeline.tvm_env import tvm

    if isinstance(obj, tvm.IRModule):
        funcs = [v for v in obj.functions.values() if isinstance(v, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            return None
        return tvm.IRModule({"main": funcs[0].with_attr("global_symbol", "main")})
    if isinstance(obj, tvm.tirx.PrimFunc):
        return tvm.IRModule({"main": obj.with_attr("global_symbol", "main")})
    return None


def load_kernel(path: str | Path, timeout_s: float = 60.0):
    """An IRModule with one PrimFunc `main`, or KernelError. The file is code (a Python file
    runs; TVMScript evaluates expressions): it is loaded in a worker process with a timeout,
    so a kernel file that hangs or crashes costs that worker, not this process."""
    return load_in_worker(_load_kernel_json, path, timeout_s)


def load_in_worker(loader, path: str | Path, timeout_s: float):
    """`loader(path)` -> (ok, IRModule as JSON or the error) run in a fresh worker process
    with a timeout; the IRModule, or KernelError (one line)."""
    import concurrent.futures
    import multiprocessing

    from pipeline.tvm_env import tvm

    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        future = pool.submit(loader, str(path))
        try:
            ok, payload = future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
            raise KernelError(f"{path}: loading it took more than {timeout_s:.0f} s") from None
        except concurrent.futures.process.BrokenProcessPool:
            raise KernelError(f"{path}: loading it crashed the worker process") from None
    if not ok:
        raise KernelError(payload)
    return tvm.ir.load_json(payload)


def _load_kernel_json(path: str) -> tuple[bool, str]:
    from pipeline.tvm_env import tvm

    try:
        return True, tvm.ir.save_json(_load_kernel_here(path))
    except KernelError as err:
        return False, str(err)


def _load_kernel_here(path: str | Path):
    """load_kernel's work, in the current process."""
    from pipeline.tvm_env import last_line, tvm

    path = Path(path)
    if not path.is_file():
        raise KernelError(f"{path}: no such file")
    text = path.read_text()
    found = []
    if path.suffix == ".py":
        try:
            namespace = runpy.run_path(str(path), run_name="__kernel__")
        except SyntaxError as err:
            raise KernelError(f"{path}:{err.lineno}: does not parse: {err.msg}") from None
        except Exception as err:  # the user's file raised while running
            raise KernelError(f"{path}: running it raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
        for value in namespace.values():
            mod = _as_module(value)
            if mod is not None:
                found.append(mod)
        if not found:
            tensors = [v for v in namespace.values() if isinstance(v, tvm.te.Tensor)]
            if tensors:
                try:
                    found.append(tvm.IRModule({"main": tvm.te.create_prim_func(tensors)}))
                except Exception as err:
                    raise KernelError(f"{path}: te.create_prim_func on its tensors failed: {last_line(err) or type(err).__name__}") from None
    else:
        try:
            obj = tvm.script.from_source(text)
        except Exception as err:
            msg = [ln for ln in str(err).splitlines() if ln.strip()]
            raise KernelError(f"{path}: does not parse as TVMScript: {msg[-1] if msg else type(err).__name__}") from None
        mod = _as_module(obj)
        if mod is not None:
            found.append(mod)
    if not found:
        raise KernelError(f"{path}: no PrimFunc found (define one with @T.prim_func, an IRModule, or TE tensors)")
    if len(found) > 1:
        raise KernelError(f"{path}: {len(found)} PrimFuncs found; keep exactly one in the file")
    return found[0]


def optimize(kernel_path: str, target_spec, attempts: int, model_dir: str, out_dir: str,
             timeout_s: float = 60.0, progress: bool = True, free: bool = False) -> dict:
    from pipeline import codec, models
    from pipeline.prompts import construction_prompt
    from pipeline.describe import DescribeError, describe
    from pipeline.generate import GenerationParams, generate
    from pipeline.tvm_env import Schedule, make_target
    from pipeline.verify import Checker

    mod = load_kernel(kernel_path)
    target = make_target(target_spec)
    model, tok = models.load(model_dir)
    try:
        prompt = construction_prompt(describe(mod), target.kind.name)
    except DescribeError as err:
        raise KernelError(f"{kernel_path}: {err}") from None
    g = GenerationParams(attempts=attempts, guided=not free)
    start = time.perf_counter()
    scripts = generate(model, tok, [prompt], g, kernels=[(mod, target)]).scripts[0]
    gen_s = time.perf_counter() - start
    outcomes = Checker(timeout_s=timeout_s, workers=2).check_many(mod, scripts, target_spec, timed=True)
    counts = {s: 0 for s in STAGES}
    for o in outcomes:
        counts[o.stage] += 1
    ok = [(o, s) for o, s in zip(outcomes, scripts) if o.correct and o.latency_s]
    result = {"kernel": str(kernel_path), "target": str(target), "model": str(model_dir), "attempts": attempts,
              "decoding": "free" if free else "guided", "outcomes": counts, "seconds": round(time.perf_counter() - start, 2),
              "generation_seconds": round(gen_s, 2), "verified": bool(ok)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if ok:
        best, script = min(ok, key=lambda x: x[0].latency_s)
        sch = Schedule(mod, debug_mask=0)
        codec.decode(mod, script, target).apply_to_schedule(sch, remove_postproc=False)
        files.write_text_atomic(out / "best.script", script + "\n")
        files.write_text_atomic(out / "scheduled.py", sch.mod.script())
        result.update({"latency_s": best.latency_s, "baseline_s": best.baseline_s, "speedup": best.speedup,
                       "script": str(out / "best.script"), "scheduled": str(out / "scheduled.py")})
    files.write_text_atomic(out / "result.json", json.dumps(result, indent=2) + "\n")
    return result
