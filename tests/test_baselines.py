"""pipeline.baselines: a shard's DLight baselines timed inline, or beside the tuning on a thread
that takes the device lock like every measurement of the tuning."""

import json
import os
import time

import pytest

from pipeline import baselines, device_lock
from pipeline.workloads import Spec

SHARD = [Spec("matmul", (16, 64, 64), "float32"), Spec("matmul", (8, 32, 48), "float32")]


@pytest.fixture(autouse=True)
def _no_lock(monkeypatch):
    monkeypatch.delenv(device_lock.ENV, raising=False)


def _timed(shard_dir):
    return json.loads((shard_dir / "baselines.json").read_text())


def test_inline_times_the_shard_before_returning(tmp_path, cpu_target):
    calls = []
    with baselines.Timer(cpu_target, beside=False, lock_path=tmp_path / "x.lock") as timer:
        assert device_lock.path() is None            # inline: nothing else measures meanwhile
        seconds = timer.submit(tmp_path, SHARD, then=lambda: calls.append(1))
        assert seconds > 0 and calls == [1]
        assert {s.id for s in SHARD} == set(_timed(tmp_path))
        assert all(v["latency_s"] > 0 for v in _timed(tmp_path).values())
        assert timer.wait() < 0.1


def test_beside_waits_for_the_device_lock_and_writes_when_done(tmp_path, cpu_target):
    """Submitted beside, nothing is timed while the tuning holds the lock; released, both
    workloads are timed, written and then archived (`then`), and the lock setting is undone."""
    lock = tmp_path / "gpu.lock"
    calls = []
    with baselines.Timer(cpu_target, beside=True, lock_path=lock) as timer:
        assert device_lock.path() == str(lock)       # the tuning's measurements take it too
        with device_lock.held():
            start = time.perf_counter()
            assert timer.submit(tmp_path, SHARD, then=lambda: calls.append(1)) == 0.0
            assert time.perf_counter() - start < 0.5
            time.sleep(2.0)                            # the build is done by now; the timing waits
            assert not (tmp_path / "baselines.json").exists() and calls == []
        timer.wait()
        assert {s.id for s in SHARD} == set(_timed(tmp_path)) and calls == [1]
        assert all(v["latency_s"] > 0 for v in _timed(tmp_path).values())
        assert timer.background_s > 0
    assert os.environ.get(device_lock.ENV) is None and not lock.exists()     # the process's own lock: removed


def test_a_shared_gpus_lock_is_kept_and_a_known_baseline_not_timed_again(tmp_path, cpu_target, monkeypatch):
    monkeypatch.setenv(device_lock.ENV, str(tmp_path / "shared.lock"))
    (tmp_path / "baselines.json").write_text(json.dumps({SHARD[0].id: {"latency_s": 1.0, "error": None}}))
    with baselines.Timer(cpu_target, beside=True, lock_path=tmp_path / "own.lock") as timer:
        assert device_lock.path() == str(tmp_path / "shared.lock")
        timer.submit(tmp_path, SHARD)
        timer.wait()
    assert os.environ[device_lock.ENV] == str(tmp_path / "shared.lock")
    timed = _timed(tmp_path)
    assert timed[SHARD[0].id]["latency_s"] == 1.0 and timed[SHARD[1].id]["latency_s"] > 0
