"""Check a generated script end to end: decode -> apply -> postprocess -> build -> run ->
compare with the reference -> (optionally) time. Numerics before timing.

The reference is an unscheduled build of the same workload (on GPU targets, where an
unscheduled kernel cannot run, the DLight default schedule: measure.baseline_module). Its
outputs and latency are computed once per (workload, inputs seed) in each worker process and
reused; the baseline latency is timed the same way as the script, in the same process.

Every stage's failure is an outcome, never an exception. Build and run happen in worker
processes with a timeout (TVM's PopenPoolExecutor), so a script that hangs or crashes the
compiler costs only its own attempt; the worker is replaced. Builds run in parallel; runs and
timings take turns (a file lock), so concurrent workers never time kernels against each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from dataclasses import asdict, dataclass

import numpy as np

from pipeline import codec
from pipeline.measure import (TOLERANCES, baseline_module, build, device_available, random_inputs, run,
                              short_error as _short, time_executable)
from pipeline.tvm_env import TVM_ERRORS, Schedule, make_target, structural_hash, tvm, worker_init

STAGES = ("decode", "apply", "postproc", "build", "run", "numerics", "ok")


@dataclass
class Outcome:
    stage: str                     # the first stage that failed, or "ok"
    error: str | None = None
    latency_s: float | None = None
    baseline_s: float | None = None  # the reference's latency, timed like the script (timed checks)
    line: int = 0                  # for decode failures: the 1-based line of the first error

    @property
    def correct(self) -> bool:
        return self.stage == "ok"

    @property
    def speedup(self) -> float | None:
        return self.baseline_s / self.latency_s if self.latency_s and self.baseline_s else None

    def to_json(self) -> dict:
        return asdict(self)


# (workload hash, target, seed) -> (reference outputs, reference latency or None). Per process.
_REFERENCE: dict[tuple, tuple[list[np.ndarray], float | None]] = {}


def reference(mod, target, seed: int = 0, timed: bool = False) -> tuple[list[np.ndarray], float | None]:
    key = (structural_hash(mod), str(target), seed)
    cached = _REFERENCE.get(key)
    if cached is None or (timed and cached[1] is None):
        inputs = random_inputs(mod, seed)
        executable = build(baseline_module(mod, target), target)
        outputs = run(executable, target, inputs)
        latency = time_executable(executable, target, inputs) if timed else None
        cached = _REFERENCE[key] = (outputs, latency)
    return cached


@contextlib.contextmanager
def _exclusive(lock_path: str | None):
    """Runs and timings of all workers take turns on the device (builds stay parallel), so
    one worker's timing never shares the cores or the GPU with another's."""
    if not lock_path:
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _decode_and_build(mod, text: str, target):
    """(executable, None), or (None, the Outcome of the stage that failed: decode, apply,
    postproc or build)."""
    try:
        trace = codec.decode(mod, text, target)
    except codec.DecodeError as err:
        return None, Outcome(err.stage, str(err), line=err.line)
    sch = Schedule(mod, debug_mask=0)
    try:
        trace.apply_to_schedule(sch, remove_postproc=False)
        return build(sch.mod, target), None
    except TVM_ERRORS as err:
        return None, Outcome("build", _short(err))


def compile_check(mod, text: str, target) -> Outcome:
    """On a machine without the target's device: decode, apply, postprocess, build, and for
    CUDA compile the generated source with nvcc (without a GPU, `tvm.compile` keeps CUDA C
    uncompiled, so a successful build alone proves only code generation; GPU.md)."""
    executable, failed = _decode_and_build(mod, text, target)
    if failed is not None or target.kind.name != "cuda":
        return failed or Outcome("ok")
    from tvm.support import nvcc

    module = executable.mod if hasattr(executable, "mod") else executable
    try:
        source = module.imports[0].inspect_source()
        with target:
            nvcc.compile_cuda(source, target_format="cubin", compiler="nvcc")
    except (*TVM_ERRORS, OSError) as err:
        return Outcome("build", f"nvcc: {_short(err)}")
    return Outcome("ok")


def check_in_process(mod, text: str, target, seed: int = 0, timed: bool = False,
                     lock_path: str | None = None) -> Outcome:
    executable, failed = _decode_and_build(mod, text, target)
    if failed is not None:
        return failed
    if not device_available(target):
        return Outcome("run", f"no {target.kind.name} device here")
    inputs = random_inputs(mod, seed)
    with _exclusive(lock_path):
        return _run_and_compare(mod, executable, target, inputs, seed, timed)


def _run_and_compare(mod, executable, target, inputs, seed: int, timed: bool) -> Outcome:
    try:
        outputs = run(executable, target, inputs)
        want_all, baseline_s = reference(mod, target, seed, timed)
    except TVM_ERRORS as err:
        return Outcome("run", _short(err))
    # The last argument is the output (TE create_prim_func order).
    got, want = outputs[-1].astype("float64"), want_all[-1].astype("float64")
    rtol, atol = TOLERANCES.get(str(outputs[-1].dtype), TOLERANCES["float32"])
    if not (np.isfinite(got).all() and np.allclose(got, want, rtol=rtol, atol=atol)):
        err = float(np.nanmax(np.abs(got - want))) if got.shape == want.shape else float("nan")
        return Outcome("numerics", f"max abs error {err:.3g} (rtol {rtol}, atol {atol})")
    if not timed:
        return Outcome("ok")
    try:
        return Outcome("ok", None, time_executable(executable, target, inputs), baseline_s)
    except TVM_ERRORS as err:
        return Outcome("run", _short(err))


def _worker_compile(mod_json: str, text: str, target_spec) -> dict:
    return compile_check(tvm.ir.load_json(mod_json), text, make_target(target_spec)).to_json()


def _worker_check(mod_json: str, text: str, target_spec, seed: int, timed: bool, lock_path: str | None) -> dict:
    mod = tvm.ir.load_json(mod_json)
    return check_in_process(mod, text, make_target(target_spec), seed, timed, lock_path).to_json()


class Checker:
    """Checks scripts in worker processes with a timeout per script; `check_many` checks a
    batch in parallel (one build per worker at a time)."""

    def __init__(self, timeout_s: float = 60.0, workers: int = 1):
        from tvm.support.popen_pool import PopenPoolExecutor

        self.timeout_s = timeout_s
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s, initializer=worker_init)
        self._lock_file = (tempfile.NamedTemporaryFile(prefix="little-dragon-device-", suffix=".lock")
                           if workers > 1 else None)
        self.lock_path = self._lock_file.name if self._lock_file else None

    def _submit(self, mod_json: str, text: str, target_spec, seed: int, timed: bool):
        return self.pool.submit(_worker_check, mod_json, text, target_spec, seed, timed, self.lock_path)

    def _result(self, future) -> Outcome:
        try:
            return Outcome(**future.result())
        except TimeoutError:
            return Outcome("run", f"timeout after {self.timeout_s:.0f} s")
        except (ChildProcessError, RuntimeError, OSError, EOFError) as err:  # the worker died
            return Outcome("build", f"worker crashed: {_short(err)}")

    def compile_many(self, mod, texts: list[str], target_spec) -> list[Outcome]:
        """compile_check of each script in the worker processes (no device needed)."""
        mod_json = tvm.ir.save_json(mod)
        return [self._result(self.pool.submit(_worker_compile, mod_json, t, target_spec)) for t in texts]

    def check(self, mod, text: str, target_spec, seed: int = 0, timed: bool = False) -> Outcome:
        return self.check_many(mod, [text], target_spec, seed, timed)[0]

    def check_many(self, mod, texts: list[str], target_spec, seed: int = 0, timed: bool = False) -> list[Outcome]:
        mod_json = tvm.ir.save_json(mod)
        futures = [self._submit(mod_json, t, target_spec, seed, timed) for t in texts]
        return [self._result(f) for f in futures]
