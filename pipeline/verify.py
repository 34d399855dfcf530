"""Check a generated script end to end: decode -> apply -> postprocess -> build -> run ->
compare with the unscheduled reference -> (optionally) time. Numerics before timing.

Every stage's failure is an outcome, never an exception. Build and run happen in a worker
process with a timeout (TVM's PopenPoolExecutor), so a script that hangs or crashes the
compiler costs only its own attempt; the worker is replaced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from pipeline import codec
from pipeline.measure import TOLERANCES, baseline_module, build, device_available, random_inputs, run, time_executable
from pipeline.tvm_env import TVM_ERRORS, Schedule, make_target, tvm, worker_init

STAGES = ("decode", "apply", "postproc", "build", "run", "numerics", "ok")


@dataclass
class Outcome:
    stage: str                     # the first stage that failed, or "ok"
    error: str | None = None
    latency_s: float | None = None

    @property
    def correct(self) -> bool:
        return self.stage == "ok"

    def to_json(self) -> dict:
        return asdict(self)


def _short(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(err).__name__)[:300]


def check_in_process(mod, text: str, target, seed: int = 0, timed: bool = False) -> Outcome:
    try:
        trace = codec.decode(mod, text, target)
    except codec.DecodeError as err:
        return Outcome(err.stage, str(err))
    sch = Schedule(mod, debug_mask=0)
    try:
        trace.apply_to_schedule(sch, remove_postproc=False)
        executable = build(sch.mod, target)
    except TVM_ERRORS as err:
        return Outcome("build", _short(err))
    if not device_available(target):
        return Outcome("run", f"no {target.kind.name} device here")
    inputs = random_inputs(mod, seed)
    try:
        outputs = run(executable, target, inputs)
        reference = run(build(baseline_module(mod, target), target), target, inputs)
    except TVM_ERRORS as err:
        return Outcome("run", _short(err))
    # The last argument is the output (TE create_prim_func order).
    got, want = outputs[-1].astype("float64"), reference[-1].astype("float64")
    rtol, atol = TOLERANCES.get(str(outputs[-1].dtype), TOLERANCES["float32"])
    if not (np.isfinite(got).all() and np.allclose(got, want, rtol=rtol, atol=atol)):
        err = float(np.nanmax(np.abs(got - want))) if got.shape == want.shape else float("nan")
        return Outcome("numerics", f"max abs error {err:.3g} (rtol {rtol}, atol {atol})")
    latency = time_executable(executable, target, inputs) if timed else None
    return Outcome("ok", None, latency)


def _worker_check(mod_json: str, text: str, target_spec, seed: int, timed: bool) -> dict:
    mod = tvm.ir.load_json(mod_json)
    return check_in_process(mod, text, make_target(target_spec), seed, timed).to_json()


class Checker:
    """Checks scripts in a worker process with a timeout per script."""

    def __init__(self, timeout_s: float = 60.0, workers: int = 1):
        from tvm.support.popen_pool import PopenPoolExecutor

        self.timeout_s = timeout_s
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s, initializer=worker_init)

    def check(self, mod, text: str, target_spec, seed: int = 0, timed: bool = False) -> Outcome:
        future = self.pool.submit(_worker_check, tvm.ir.save_json(mod), text, target_spec, seed, timed)
        try:
            return Outcome(**future.result())
        except TimeoutError:
            return Outcome("run", f"timeout after {self.timeout_s:.0f} s")
        except (ChildProcessError, RuntimeError, OSError, EOFError) as err:  # the worker died
            return Outcome("build", f"worker crashed: {_short(err)}")
