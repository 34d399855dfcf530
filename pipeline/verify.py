"""Check a generated script end to end: decode -> apply -> postprocess -> build -> run ->
compare with the reference -> (optionally) time. Numerics before timing.

The reference is an unscheduled build of the same workload (on GPU targets, where an
unscheduled kernel cannot run, the DLight default schedule: measure.baseline_module). Its
outputs and latency are computed once per (workload, inputs seed) in each worker process and
reused; the baseline latency is timed the same way as the script, in the same process.

Every stage's failure is an outcome, never an exception. Each script is checked in a worker
process (TVM's PopenWorker) in two phases, each with its own timeout: build (decode, apply,
postprocess, build; in parallel over the workers) and run (run, compare, time; the same
worker, which holds the built kernel, runs it once the checker's device lock is free, so
runs and timings take turns and waiting for the lock never counts against a timeout; a GPU
shared with other processes adds their turns, pipeline.device_lock). A
timeout or a worker crash is labelled with the phase it happened in; the worker is replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from pipeline import codec, device_lock
from pipeline.measure import (TOLERANCES, baseline_module, build, close, device_available, is_gpu, random_inputs,
                              short_error as _short, time_tensors, upload)
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


class _Recent:
    """A per-process cache of the most recently used workloads' entries: at most `items` of
    them and `max_bytes` of arrays (the newest entry is always kept). RL batches come back to
    the same few workloads; an evaluation moves through its tasks one after another."""

    def __init__(self, items: int = 8, max_bytes: int = 1 << 30):
        self.items, self.max_bytes = items, max_bytes
        self._data: OrderedDict = OrderedDict()

    def get(self, key):
        if key in self._data:
            self._data.move_to_end(key)
        return self._data.get(key)

    def put(self, key, value):
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > 1 and (len(self._data) > self.items or self._bytes() > self.max_bytes):
            self._data.popitem(last=False)
        return value

    def _bytes(self) -> int:
        def size(v) -> int:
            if isinstance(v, np.ndarray):
                return v.nbytes
            return sum(size(x) for x in v) if isinstance(v, (list, tuple)) else 0
        return sum(size(v) for v in self._data.values())


# Per process, for the recent workloads: their random inputs ((hash, seed) -> arrays), the
# reference's executable ((hash, target) -> it) and its output and latency ((hash, target,
# seed) -> ([output], seconds or None)).
_INPUTS, _REFERENCE_BUILT, _REFERENCE = _Recent(), _Recent(), _Recent()


def inputs_for(mod, seed: int = 0) -> list[np.ndarray]:
    """measure.random_inputs, made once per workload and seed in this process (for a
    10^8-element workload that is seconds a check; runs copy them to the device, never write them)."""
    key = (structural_hash(mod), seed)
    got = _INPUTS.get(key)
    return got if got is not None else _INPUTS.put(key, random_inputs(mod, seed))


def reference_build(mod, target):
    """The reference kernel built, once per workload in this process."""
    key = (structural_hash(mod), str(target))
    got = _REFERENCE_BUILT.get(key)
    return got if got is not None else _REFERENCE_BUILT.put(key, build(baseline_module(mod, target), target))


def reference(mod, target, seed: int = 0, timed: bool = False) -> tuple[list[np.ndarray], float | None]:
    """([the reference's output], its latency if `timed`); only the output (the last argument)
    is kept: the comparison needs nothing else."""
    key = (structural_hash(mod), str(target), seed)
    cached = _REFERENCE.get(key)
    if cached is None or (timed and cached[1] is None):
        executable = reference_build(mod, target)
        dev, tensors, output = _run_once(executable, target, inputs_for(mod, seed))
        latency = time_tensors(executable, dev, tensors) if timed else None
        cached = _REFERENCE.put(key, ([output], latency))
    return cached


def _run_once(executable, target, inputs) -> tuple:
    """(device, the arguments on it, the output read back): one device copy of the inputs serves
    the run and then the timing; the output is the last argument (TE create_prim_func order)."""
    dev, tensors = upload(inputs, target)
    executable.mod["main"](*tensors)
    dev.sync()
    return dev, tensors, tensors[-1].numpy()


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
    uncompiled, so a successful build alone proves only code generation; GPU.md). Where the
    device is, the build itself ran nvcc (the H200's build failures are nvcc's): nothing more."""
    executable, failed = _decode_and_build(mod, text, target)
    if failed is not None or target.kind.name != "cuda" or device_available(target):
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


def check_in_process(mod, text: str, target, seed: int = 0, timed: bool = False) -> Outcome:
    executable, failed = _decode_and_build(mod, text, target)
    if failed is not None:
        return failed
    return _run_built(mod, executable, target, seed, timed)


def _run_built(mod, executable, target, seed: int, timed: bool, baseline_s: float | None = None) -> Outcome:
    if not device_available(target):
        return Outcome("run", f"no {target.kind.name} device here")
    return _run_and_compare(mod, executable, target, inputs_for(mod, seed), seed, timed, baseline_s)


def _run_and_compare(mod, executable, target, inputs, seed: int, timed: bool,
                     known_baseline_s: float | None = None) -> Outcome:
    """`known_baseline_s`: the reference's latency as timed already for this kernel (by another
    worker of the same checker): its output is still computed here, its timing not repeated."""
    try:
        dev, tensors, got = _run_once(executable, target, inputs)
        want, baseline_s = reference(mod, target, seed, timed and known_baseline_s is None)
        baseline_s = known_baseline_s if known_baseline_s is not None else baseline_s
    except TVM_ERRORS as err:
        return Outcome("run", _short(err))
    rtol, atol = TOLERANCES.get(str(got.dtype), TOLERANCES["float32"])
    ok, err = close(got, want[-1], rtol, atol)
    if not ok:
        return Outcome("numerics", f"max abs error {err:.3g} (rtol {rtol}, atol {atol})")
    if not timed:
        return Outcome("ok")
    try:
        return Outcome("ok", None, time_tensors(executable, dev, tensors), baseline_s)
    except TVM_ERRORS as err:
        return Outcome("run", _short(err))


# In a worker process: the kernel the last build phase made, for the run phase that follows.
_BUILT: dict = {}


def _worker_compile(mod_json: str, text: str, target_spec) -> dict:
    return compile_check(tvm.ir.load_json(mod_json), text, make_target(target_spec)).to_json()


def _worker_build(mod_json: str, text: str, target_spec, seed: int = 0) -> dict | None:
    """Build phase: None when the kernel is built (kept for `_worker_run`), else the Outcome.
    The reference's build and the random inputs are made here too (once per workload), in
    parallel over the workers, not in the run phase where the workers take turns."""
    _BUILT.clear()
    mod, target = tvm.ir.load_json(mod_json), make_target(target_spec)
    executable, failed = _decode_and_build(mod, text, target)
    if failed is not None:
        return failed.to_json()
    _BUILT.update(mod=mod, target=target, executable=executable)
    try:
        reference_build(mod, target)
        inputs_for(mod, seed)
    except TVM_ERRORS:
        pass        # the run phase needs the reference and reports its failure there
    return None


def _worker_run(seed: int, timed: bool, baseline_s: float | None = None) -> dict:
    built = dict(_BUILT)
    _BUILT.clear()
    return _run_built(built["mod"], built["executable"], built["target"], seed, timed, baseline_s).to_json()


class Checker:
    """Checks scripts in worker processes, build and run phases each with `timeout_s`;
    `check_many` builds a batch in parallel (`workers` processes) and runs one at a time.
    Inside `alone()`, builds take turns with runs too: on a CPU target a kernel timed while
    another worker compiles shares the cores with the compiler."""

    def __init__(self, timeout_s: float = 60.0, workers: int = 1):
        self.timeout_s = timeout_s
        self._alone = False
        self._threads = ThreadPoolExecutor(max_workers=workers)
        self._local = threading.local()
        self._device = threading.Lock()
        self._workers: list = []
        # the reference's latency per (kernel, target, seed), timed once by whichever worker ran the
        # kernel's first script: each worker keeps its own reference outputs, and a batch spreads a
        # kernel's scripts over the workers, so each timed the same reference again (12 times for a
        # task's 12 scripts on the H200's 14 workers)
        self._baselines: dict[tuple, float] = {}

    def _worker(self):
        from tvm.support.popen_pool import PopenWorker

        worker = getattr(self._local, "worker", None)
        if worker is None:
            worker = self._local.worker = PopenWorker(initializer=worker_init)
            self._workers.append(worker)
        return worker

    def call(self, phase: str, fn, *args, timeout_s: float | None = None):
        """fn(*args) in this thread's worker with a timeout (`timeout_s`, default the
        checker's): its result, or the Outcome of a timeout, a crash or what fn raised, labelled
        `phase`. The worker is replaced after a timeout or crash."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        worker = self._worker()
        worker.send(fn, args, timeout=timeout_s)
        try:
            return worker.recv()
        except TimeoutError:
            return Outcome(phase, f"{phase} timeout after {timeout_s:.0f} s")
        except ChildProcessError:
            return Outcome(phase, f"worker crashed during {phase}")
        except Exception as err:   # noqa: BLE001 - raised inside the worker: still this phase's outcome
            return Outcome(phase, f"{type(err).__name__}: {_short(err)}")

    def call_many(self, phase: str, fn, arg_lists: list[tuple], timeout_s: float | None = None) -> list:
        """call() for each argument tuple, side by side in the checker's workers."""
        return list(self._threads.map(lambda args: self.call(phase, fn, *args, timeout_s=timeout_s), arg_lists))

    def _check_one(self, mod_json: str, text: str, target_spec, seed: int, timed: bool, ref_key: tuple) -> Outcome:
        """`ref_key`: the kernel's key for the reference's one timing (`_baselines`)."""
        alone = self._alone
        with self._turn() if alone else contextlib.nullcontext():
            built = self.call("build", _worker_build, mod_json, text, target_spec, seed)
            if isinstance(built, Outcome):
                return built
            if built is not None:
                return Outcome(**built)
            # runs and timings take turns (with other processes too, on a shared GPU: pipeline.device_lock);
            # the wait is not timed
            with contextlib.nullcontext() if alone else self._turn():
                ran = self.call("run", _worker_run, seed, timed, self._baselines.get(ref_key) if timed else None)
                out = ran if isinstance(ran, Outcome) else Outcome(**ran)
                if timed and out.baseline_s is not None:
                    self._baselines.setdefault(ref_key, out.baseline_s)
        return out

    @contextlib.contextmanager
    def _turn(self):
        """The device: this checker's runs one at a time, and other processes' (pipeline.device_lock)."""
        with self._device, device_lock.held():
            yield

    @contextlib.contextmanager
    def alone(self):
        """Checks in the block build one at a time, never beside a run (a quiet machine for the
        timings that decide a comparison; slower: the builds no longer overlap)."""
        before, self._alone = self._alone, True
        try:
            yield self
        finally:
            self._alone = before

    @contextlib.contextmanager
    def alone_on_cpu(self, target_spec):
        """`alone()` on a CPU target, where a build shares the cores with the kernel being timed; on a
        GPU the builds stay beside the runs. Yields whether the checks are alone."""
        cpu = not is_gpu(make_target(target_spec))
        with self.alone() if cpu else contextlib.nullcontext():
            yield cpu

    def _compile_one(self, mod_json: str, text: str, target_spec) -> Outcome:
        out = self.call("build", _worker_compile, mod_json, text, target_spec)
        return out if isinstance(out, Outcome) else Outcome(**out)

    def compile_many(self, mod, texts: list[str], target_spec) -> list[Outcome]:
        """compile_check of each script in the worker processes (no device needed)."""
        return self.compile_pairs([(mod, t) for t in texts], target_spec)

    def compile_pairs(self, items: list[tuple], target_spec) -> list[Outcome]:
        """compile_check of each (kernel, script), all side by side."""
        saved: dict[int, str] = {}
        for mod, _ in items:
            if id(mod) not in saved:
                saved[id(mod)] = tvm.ir.save_json(mod)
        return list(self._threads.map(lambda it: self._compile_one(saved[id(it[0])], it[1], target_spec), items))

    def check(self, mod, text: str, target_spec, seed: int = 0, timed: bool = False) -> Outcome:
        return self.check_many(mod, [text], target_spec, seed, timed)[0]

    def check_many(self, mod, texts: list[str], target_spec, seed: int = 0, timed: bool = False) -> list[Outcome]:
        return self.check_pairs([(mod, t) for t in texts], target_spec, seed, timed)

    def check_pairs(self, items: list[tuple], target_spec, seed: int = 0, timed: bool = False) -> list[Outcome]:
        """check of each (kernel, script), all side by side: several kernels' scripts build at once."""
        saved: dict[int, tuple[str, tuple]] = {}     # per kernel: its JSON, and its reference's key
        spec = json.dumps(target_spec, sort_keys=True, default=str)
        for mod, _ in items:
            if id(mod) not in saved:
                mod_json = tvm.ir.save_json(mod)
                saved[id(mod)] = mod_json, (hashlib.sha1(mod_json.encode()).hexdigest(), spec, seed)
        return list(self._threads.map(lambda it: self._check_one(saved[id(it[0])][0], it[1], target_spec, seed, timed,
                                                                 saved[id(it[0])][1]), items))

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        for worker in self._workers:
            worker.kill()
        self._workers.clear()
