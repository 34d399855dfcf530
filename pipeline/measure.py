"""Build, check and time kernels. Check against a reference *before* timing (llm.c's rule).

The baseline a speedup is measured against (ANCHORS.md, metric "Speedup"):
- CPU (llvm): the unscheduled kernel, built as is.
- CUDA: the default schedule a user gets without tuning, TVM's DLight GPU rules (an
  unscheduled kernel cannot run on a GPU at all: it has no thread bindings).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline import device_lock, distributed
from pipeline.tvm_env import TVM_ERRORS, tvm

# TVM's validator uses allclose(rtol=1e-3, atol=2e-3) for fp32 (ANCHORS.md). fp16 outputs
# carry ~3 decimal digits, and fp32 accumulation order differs between schedules, so the
# fp16 tolerance is looser: rtol 1e-2, atol 1e-2.
TOLERANCES = {"float32": (1e-3, 2e-3), "float16": (1e-2, 1e-2)}


@dataclass
class Timing:
    latency_s: float | None      # median of the repeats; None when not measured
    error: str | None = None
    stage: str | None = None     # where it failed: build | run | check


def is_gpu(target: "tvm.target.Target") -> bool:
    return target.kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl")


def device_for(target: "tvm.target.Target"):
    return tvm.cuda(distributed.local_device()) if target.kind.name == "cuda" else tvm.cpu(0)


def device_available(target: "tvm.target.Target") -> bool:
    return bool(device_for(target).exist)


def arg_specs(mod: "tvm.IRModule") -> list[tuple[tuple[int, ...], str]]:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [(tuple(int(x) for x in a.shape), str(a.dtype)) for a in ArgInfo.from_prim_func(mod["main"])]


def random_inputs(mod: "tvm.IRModule", seed: int = 0) -> list[np.ndarray]:
    """Random values for every argument (outputs too: they are overwritten, and a poisoned
    output shows an element the kernel never wrote). Never zeros: they hide bugs."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, size=shape).astype(dtype) for shape, dtype in arg_specs(mod)]


def baseline_module(mod: "tvm.IRModule", target: "tvm.target.Target") -> "tvm.IRModule":
    if not is_gpu(target):
        return mod
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(
            dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
        )(mod)


def build(mod: "tvm.IRModule", target: "tvm.target.Target"):
    return tvm.compile(mod, target=target)


def run(executable, target, inputs: list[np.ndarray]) -> list[np.ndarray]:
    dev, tensors = upload(inputs, target)
    executable.mod["main"](*tensors)
    dev.sync()
    return [t.numpy() for t in tensors]


def upload(inputs: list[np.ndarray], target) -> tuple:
    """(device, the inputs as tensors on it): one copy serves a run and its timing."""
    dev = device_for(target)
    return dev, [tvm.runtime.tensor(x, dev) for x in inputs]


def time_executable(executable, target, inputs, number: int = 3, repeat: int = 5, min_repeat_ms: int = 20) -> float:
    """Median seconds per call, from TVM's time evaluator (warm-up included)."""
    dev, tensors = upload(inputs, target)
    return time_tensors(executable, dev, tensors, number, repeat, min_repeat_ms)


def time_tensors(executable, dev, tensors, number: int = 3, repeat: int = 5, min_repeat_ms: int = 20) -> float:
    """`time_executable` on arguments already on the device."""
    evaluator = executable.mod.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return float(np.median(evaluator(*tensors).results))


def close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, chunk: int = 1 << 22) -> tuple[bool, float]:
    """numpy's allclose(got, want, rtol, atol) with every element of `got` finite, and the
    largest absolute error: in chunks, in float32 for float16/float32 outputs (the rounding of
    one float32 subtraction is ~1e-7 relative, far below the tolerances), else in float64, so
    a 10^8-element output costs neither seconds nor gigabytes of float64 copies."""
    if got.shape != want.shape:
        return False, float("nan")
    wide = np.float32 if got.dtype in (np.float16, np.float32) and want.dtype in (np.float16, np.float32) else np.float64
    g, w = got.reshape(-1), want.reshape(-1)
    ok, worst = True, 0.0
    for i in range(0, max(1, g.size), chunk):
        a, b = g[i:i + chunk].astype(wide), w[i:i + chunk].astype(wide)
        diff = np.abs(a - b)
        if not np.isfinite(a).all() or not (diff <= atol + rtol * np.abs(b)).all():
            ok = False
        worst = max(worst, float(np.nanmax(diff))) if diff.size else worst
    return ok, worst


def measure_baseline(mod, target, number: int = 3, repeat: int = 5, min_repeat_ms: int = 20) -> Timing:
    """Latency of the baseline kernel; `latency_s` is None where the target's device is absent."""
    try:
        executable = build(baseline_module(mod, target), target)
    except TVM_ERRORS as err:
        return Timing(None, short_error(err), "build")
    if not device_available(target):
        return Timing(None, f"no {target.kind.name} device on this machine", "run")
    try:
        inputs = random_inputs(mod)
        with device_lock.held():        # a GPU shared with other processes: take turns
            return Timing(time_executable(executable, target, inputs, number, repeat, min_repeat_ms))
    except TVM_ERRORS as err:
        return Timing(None, short_error(err), "run")


def short_error(err: BaseException) -> str:
    """The last informative line of a TVM error (not a caret or a bare location)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if sum(c.isalpha() for c in ln) > 3]
    return (lines[-1] if lines else type(err).__name__)[:300]
