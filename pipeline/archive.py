"""Search databases kept in git: one `shard-NNNN.tar.xz` per shard of the search stage's
work_dir, an `index.json` of their record counts, and `runs.jsonl` (one line per search run
that measured something: when, where, with which versions, how many candidates, how fast).

The search stage restores a shard from here when the archive holds more records than its
work_dir (a fresh clone resumes the campaign where the last machine stopped) and archives a
shard again after tuning it. Every write goes to a temporary file first, then is renamed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from pipeline import files, records

FILES = ("database_workload.json", "database_tuning_record.json", "workloads.json", "baselines.json",
         "errors.jsonl", "failed.json", "exhausted.json", "summary.json",
         "scripts.json")   # an evaluation's MetaSchedule run: its candidates encoded (pipeline.metaschedule)


def _count(shard_dir: Path) -> int:
    return sum(1 for _ in records.scan(shard_dir)) if (shard_dir / "database_tuning_record.json").exists() else 0


def _index(archive_dir: Path) -> dict:
    path = archive_dir / "index.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _entry(archive_dir: Path, name: str) -> dict:
    """The index entry of an archived shard ({} if there is no archive). An archive that the
    index does not list is read itself: an index was found missing 21 of its 36 entries
    (databases/evaluate-gpu, 2026-12-02), and trusting it made a step tune 8 kept runs again."""
    tar = archive_dir / f"{name}.tar.xz"
    if not tar.exists():
        return {}
    entry = _index(archive_dir).get(name)
    if entry is not None:
        return entry
    with tempfile.TemporaryDirectory() as tmp:
        _unpack(tar, Path(tmp))
        return {"records": _count(Path(tmp)), "digest": _digest(Path(tmp))}


def _unpack(tar: Path, shard_dir: Path) -> None:
    with tarfile.open(tar, "r:xz") as t:
        for member in t.getmembers():
            if member.name not in FILES or not member.isfile():
                continue    # only the files this module writes; never a path outside the shard
            data = t.extractfile(member).read()
            tmp = shard_dir / f".{member.name}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, shard_dir / member.name)


def restore(shard_dir: Path, archive_dir: Path) -> bool:
    """Unpack the archived shard over `shard_dir` if it holds more records; True if it did."""
    if _entry(archive_dir, shard_dir.name).get("records", 0) <= _count(shard_dir):
        return False
    shard_dir.mkdir(parents=True, exist_ok=True)
    _unpack(archive_dir / f"{shard_dir.name}.tar.xz", shard_dir)
    return True


def _digest(shard_dir: Path) -> str:
    h = hashlib.sha256()
    for name in FILES:
        path = shard_dir / name
        if path.exists():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(archive_dir: Path):
    """One writer of index.json at a time (the search stage's per-GPU processes share it)."""
    with open(archive_dir / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def save(shard_dir: Path, archive_dir: Path) -> None:
    """Archive the shard if its files changed since the last archive (byte-identical
    archives for identical files: fixed member times, sorted names)."""
    archive_dir.mkdir(parents=True, exist_ok=True)
    digest = _digest(shard_dir)
    tar = archive_dir / f"{shard_dir.name}.tar.xz"
    if _entry(archive_dir, shard_dir.name).get("digest") == digest:
        return
    tmp = archive_dir / f".{shard_dir.name}.tar.xz.tmp"
    with tarfile.open(tmp, "w:xz") as t:
        for name in FILES:
            path = shard_dir / name
            if path.exists():
                data = path.read_bytes()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    os.replace(tmp, tar)
    with _locked(archive_dir):
        index = _index(archive_dir)
        index[shard_dir.name] = {"records": _count(shard_dir), "digest": digest}
        files.write_json(archive_dir / "index.json", dict(sorted(index.items())))


def machine() -> dict:
    """Where the records were measured: GPUs and driver, CPU count, library versions."""
    import numpy
    import tvm

    out = {"host_cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
           "tvm": tvm.__version__, "numpy": numpy.__version__}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        out["gpus"] = q.stdout.strip().splitlines() if q.returncode == 0 else []
        v = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30)
        out["nvcc"] = v.stdout.strip().splitlines()[-1] if v.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        out["gpus"] = []
    try:
        import cuda.bindings

        out["cuda_bindings"] = cuda.bindings.__version__
    except ImportError:
        out["cuda_bindings"] = None
    out["cuda_compile_mode"] = os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc")
    return out


def gpu_names() -> list[str]:
    """The GPUs' names (`nvidia-smi`), one per GPU; [] where there is none."""
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [n.strip() for n in q.stdout.splitlines() if n.strip()] if q.returncode == 0 else []


class DeviceMismatch(ValueError):
    """An archive of GPU timings met a machine with another kind of GPU."""


def check_device(archive_dir: Path, names: list[str] | None = None) -> str | None:
    """Timings kept in `archive_dir` come from one kind of GPU: `device.json` names it (written by
    the first step that runs on a GPU), and a step on another kind (an H100 for an archive of H200
    timings) raises `DeviceMismatch` before anything is timed, so that results never mix. No GPU
    here: nothing to check (None). Returns the GPU the archive's timings come from."""
    names = gpu_names() if names is None else names
    if not names:
        return None
    path = Path(archive_dir) / "device.json"
    if path.exists():
        kept = json.loads(path.read_text())["gpu"]
        if kept not in names:
            raise DeviceMismatch(f"{archive_dir} keeps timings measured on {kept}, this machine has "
                                 f"{', '.join(sorted(set(names)))}: they would mix; use another archive_dir "
                                 f"for this GPU")
        return kept
    files.write_json(path, {"gpu": names[0]})
    return names[0]


def log_run(archive_dir: Path, run: dict, totals: dict) -> None:
    files.append_jsonl(archive_dir / "runs.jsonl", {"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                    "machine": machine(), **run, "totals_after": totals})
