"""Benchmark: how long an RPC session takes to start, TVM's server in spawn mode (`--no-fork`,
the mode a GPU host needs: CUDA fails in a session forked after `import tvm`) against
`pipeline.rpc_server` (the next session's process spawned and warm before it is needed).

MetaSchedule's RPC runner opens one session per measured candidate, so this start-up is paid
per candidate. A tracker and one server on 127.0.0.1; `--sessions` sessions one after another,
each requested through the tracker, asked for its device and closed, with `--gap` seconds
between them (a runner measures while the next batch builds).

    python -m pipeline.bench.rpc_sessions [--sessions 8] [--gap 1] [--out reports/rpc_sessions.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVERS = {"tvm --no-fork": ["-m", "tvm.exec.rpc_server", "--no-fork"], "pipeline.rpc_server": ["-m", "pipeline.rpc_server"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(tracker, key: str, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if any(q.get("key") == "server:" + key or q.get("key") == key
                   for q in tracker.summary().get("server_info", [])):
                return
        except Exception:   # noqa: BLE001 - still starting
            pass
        time.sleep(0.3)
    raise TimeoutError(f"no server registered under {key!r} in {seconds:.0f} s")


def _listening(port: int, proc, log: Path, seconds: float = 180) -> None:
    """Wait until something accepts connections on `port` (a tracker importing TVM on a fresh
    machine took longer than the client's retries: seen on the H200)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the tracker exited ({proc.returncode}): {log.read_text()[-500:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"the tracker did not listen on {port} in {seconds:.0f} s: {log.read_text()[-500:]}")


def sessions(server: list[str], n: int, gap: float, log: Path) -> list[float]:
    """Seconds from the request to a usable session, for `n` sessions in a row."""
    from tvm import rpc

    port, key = _free_port(), "bench"
    tracker_log = log.with_suffix(".tracker.log")
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                                "--port-end", str(port + 1)], stdout=open(tracker_log, "w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    srv = None
    try:
        _listening(port, tracker, tracker_log)
        first = _free_port()
        srv = subprocess.Popen([sys.executable, *server, "--tracker", f"127.0.0.1:{port}", "--key", key,
                                "--host", "127.0.0.1", "--port", str(first), "--port-end", str(first + 10)],
                               stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        client = rpc.connect_tracker("127.0.0.1", port)
        _wait_for(client, key)
        out = []
        for _ in range(n):
            start = time.perf_counter()
            remote = client.request(key, session_timeout=120)
            assert remote.cpu(0).exist
            out.append(time.perf_counter() - start)
            del remote
            time.sleep(gap)
        return out
    finally:
        for proc in (srv, tracker):     # the whole group: TVM's servers listen in a child process
            if proc is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between sessions")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "reports"), "rpc_sessions.json"))
    a = ap.parse_args()
    report = {"sessions": a.sessions, "gap_s": a.gap, "cores": os.cpu_count(), "servers": {}}
    for name, cmd in SERVERS.items():
        log = Path(tempfile.gettempdir()) / f"rpc_sessions.{name.split()[0].split('.')[-1]}.log"   # the server's log
        times = sessions(cmd, a.sessions, a.gap, log)
        report["servers"][name] = {"first_s": round(times[0], 3), "median_s": round(statistics.median(times), 3),
                                   "rest_median_s": round(statistics.median(times[1:]), 3) if len(times) > 1 else None,
                                   "seconds": [round(t, 3) for t in times]}
        print(name, report["servers"][name], flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
