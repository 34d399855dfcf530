"""pipeline.device_lock: processes sharing a GPU never measure at the same time."""

import multiprocessing
import time

from pipeline import device_lock


def _hold(lock: str, out, seconds: float) -> None:
    with device_lock.held(lock):
        start = time.time()
        out.put("held")
        time.sleep(seconds)
        out.put((start, time.time()))


def test_holders_in_different_processes_never_overlap(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    lock = str(tmp_path / "gpu0.lock")
    procs = [ctx.Process(target=_hold, args=(lock, out, 0.3)) for _ in range(3)]
    for proc in procs:
        proc.start()
    got = [out.get(timeout=60) for _ in range(2 * len(procs))]
    spans = sorted(x for x in got if x != "held")
    for proc in procs:
        proc.join()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_a_holder_that_dies_releases_the_lock(tmp_path):
    import os
    import signal

    ctx = multiprocessing.get_context("spawn")
    lock = str(tmp_path / "gpu0.lock")
    out = ctx.Queue()
    proc = ctx.Process(target=_hold, args=(lock, out, 60))
    proc.start()
    assert out.get(timeout=60) == "held"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    start = time.perf_counter()
    with device_lock.held(lock) as waited:
        assert waited < 5
    assert time.perf_counter() - start < 5


def test_unset_means_no_lock(monkeypatch):
    monkeypatch.delenv(device_lock.ENV, raising=False)
    assert device_lock.path() is None
    with device_lock.held() as waited:
        assert waited == 0.0


def _try_hold(lock: str, out) -> None:
    out.put(("trying", time.time(), 0.0))       # started: its wait is timed from here
    with device_lock.held(lock) as waited:
        out.put(("got", time.time(), waited))


def test_a_paused_lease_lets_another_process_measure_and_is_taken_back(tmp_path):
    """Generation on a shared GPU holds a lease and pauses it for host-only work: another
    process's measurement runs inside the pause, and the lease holds the lock again after it."""
    ctx = multiprocessing.get_context("spawn")
    lock = str(tmp_path / "gpu0.lock")
    out = ctx.Queue()
    with device_lock.lease(lock) as lease:
        other = ctx.Process(target=_try_hold, args=(lock, out))
        other.start()
        assert out.get(timeout=60)[0] == "trying"      # a spawned process takes a while to start
        time.sleep(1.0)
        assert out.empty()                              # held: the other process waits
        with lease.paused():
            tag, when, waited = out.get(timeout=60)     # it measures during the pause
        other.join()
        late = ctx.Process(target=_try_hold, args=(lock, out))
        late.start()
        assert out.get(timeout=60)[0] == "trying"
        time.sleep(1.0)
        assert out.empty()                              # taken back after the pause
        released = time.time()
    tag, when, _ = out.get(timeout=60)
    late.join()
    assert tag == "got" and when >= released and waited >= 0.9
