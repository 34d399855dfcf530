"""The one place that imports TVM's MetaSchedule stack, and the small helpers every stage shares.

Why this module exists: importing `tvm.s_tir.tensor_intrin` parses ~500 TVMScript functions,
and each parse calls `inspect.stack()`. Inside an import, the stack holds frames of
`<frozen importlib._bootstrap>`, for which `inspect.getmodule` scans all of `sys.modules`
on every call. Measured here (2 cores, apache-tvm 0.27.0.post1): 50 s per process, which
also makes every MetaSchedule builder worker time out (30 s) before it builds anything.
A frame's module is never found through a `<...>` pseudo-file, so answering `None` at
once is exactly what the scan would conclude (frames have no `__module__`/`__name__`).
With the shortcut the same import takes ~5 s.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

_original_getmodule = inspect.getmodule


def _getmodule(obj: Any, _filename: str | None = None):
    if _filename is not None and _filename.startswith("<"):
        return None
    return _original_getmodule(obj, _filename)


inspect.getmodule = _getmodule

import tvm  # noqa: E402
import tvm.s_tir.tensor_intrin  # noqa: E402,F401  (registers tensor intrinsics used by CUDA rules)
from tvm import te  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.s_tir import Schedule, Trace  # noqa: E402

__all__ = ["tvm", "te", "ms", "Schedule", "Trace", "make_target", "worker_init",
           "structural_hash", "TargetError", "TVM_ERRORS", "target_key", "last_line"]



# What TVM raises through its FFI: tvm.error.InternalError and ScheduleError are RuntimeErrors;
# argument and index checks surface as ValueError/TypeError/IndexError/KeyError.
TVM_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError)


def last_line(err: BaseException) -> str:
    """The last non-blank line of an exception's message ("" for none): TVM's errors carry a
    C++ traceback before the line that says what went wrong, and one-line messages want that."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else ""


class TargetError(ValueError):
    """A target description that TVM does not accept."""


def make_target(spec: "str | dict | tvm.target.Target") -> "tvm.target.Target":
    """Build a TVM target from a tag ("nvidia/nvidia-h100"), a JSON dict, or a JSON string; a
    target already built is returned as it is."""
    if isinstance(spec, tvm.target.Target):
        return spec
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as err:
            raise TargetError(f"target {spec!r} is not valid JSON: {err}") from None
    try:
        return tvm.target.Target(spec)
    except TVM_ERRORS as err:
        first = last_line(err) or type(err).__name__
        raise TargetError(
            f"target {spec!r} is not valid ({first}); use a tag such as 'nvidia/nvidia-h100' "
            'or a JSON dict such as {"kind": "llvm", "num-cores": 2}'
        ) from None


def target_key(target: "tvm.target.Target") -> str:
    """A stable string for a target, usable as a cache or file key."""
    return json.dumps(target.export(), sort_keys=True, default=str)


def structural_hash(mod: "tvm.IRModule") -> str:
    """MetaSchedule's workload key: the structural hash of the module, in decimal, as
    JSONDatabase writes it in `database_workload.json`."""
    return str(int(ms.utils.shash2hex(mod), 16))


def worker_init() -> None:
    """Initializer for MetaSchedule builder/runner worker processes: importing this module
    applies the import shortcut above before any worker imports tensor intrinsics."""
