"""A TVM RPC server for GPU hosts whose sessions start warm.

TVM's Python server (`python -m tvm.exec.rpc_server`) serves one session at a time, each in a
new process: forked by default, spawned with `--no-fork`. On the H200 a process forked after
`import tvm` cannot use CUDA (`cudaErrorInitializationError`, measured with
`gpu_probe_fork.py`), and a spawned one imports TVM again before every session (6-7 s there),
while MetaSchedule's RPC runner opens one session per candidate. This is TVM's own server with
one change: the next session's process is spawned (never forked) and imports TVM while the
current session runs, so a session starts at once. Everything else (the tracker protocol,
keys, session timeouts, the session itself) is TVM's code.

    python -m pipeline.rpc_server --tracker HOST:9190 --key gpu [--host 0.0.0.0] [--port 9090]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing import reduction

_SPAWN = multiprocessing.get_context("spawn")
_warm: list[tuple] = []        # (process, pipe) of the warm processes, in the listening process
_keep_warm = 4                  # how many wait, in the listening process (install sets it)


def _warm_main(conn, load_library) -> None:
    """A session's process: import TVM first, then wait for the session's socket."""
    from tvm.rpc import server

    parent = os.getppid()
    try:
        while not conn.poll(1.0):
            if os.getppid() != parent:
                return          # the server is gone (even by SIGKILL): no orphans
        fd = reduction.recv_handle(conn)
        work_path = conn.recv()
    except (EOFError, OSError):
        return                  # the server stopped before a session came
    os.chdir(work_path.path)    # as TVM's server does: sessions' files never collide
    server._serve_loop(socket.socket(fileno=fd), load_library, work_path)


def _spawn(load_library) -> tuple:
    parent, child = _SPAWN.Pipe()
    proc = _SPAWN.Process(target=_warm_main, args=(child, load_library), daemon=True)
    proc.start()
    child.close()
    return proc, parent


def _take(load_library) -> tuple:
    """A warm process for the session now (the oldest: the likeliest to have imported TVM), and
    new ones spawned so that `warm` of them wait for the next sessions."""
    global _warm
    _warm = [(p, c) for p, c in _warm if p.is_alive()]
    proc, conn = _warm.pop(0) if _warm else _spawn(load_library)
    while len(_warm) < _keep_warm:
        _warm.append(_spawn(load_library))
    return proc, conn


def _serving(sock, addr, opts, load_library) -> None:
    """tvm.rpc.server._serving with a warm process: hand it the session, keep others warm."""
    from tvm.rpc import _ffi_api, server
    from tvm.support import utils

    server.logger.info(f"connected from {addr}")
    proc, conn = _take(load_library)
    work_path = utils.tempdir()
    try:
        reduction.send_handle(conn, sock.fileno(), proc.pid)
        conn.send(work_path)
        proc.join(opts.get("timeout", None))
        if proc.is_alive():
            server.logger.info("timeout in RPC session, kill..")
            _ffi_api.ReturnException(sock.fileno(), f"RPCSessionTimeoutError: Your {opts['timeout']}s session has "
                                     'expired, try to increase the "session_timeout" value.')
            proc.terminate()
        elif proc.exitcode != 0:       # TVM's server raises here, which stops it serving: a crashed
            server.logger.warning(      # session (a bad kernel) should cost only itself
                f"session process {proc.pid} exited with code {proc.exitcode}")
        server.logger.info(f"finish serving {addr}")
    finally:
        conn.close()
        work_path.remove()
        sock.close()


def install(warm: int = 4, load_library: str | None = None) -> None:
    """In the process that listens (TVM's server runs it there): serve sessions warm, with
    `warm` processes spawned ahead (bursts of sessions find one ready)."""
    global _keep_warm
    from tvm.rpc import server

    _keep_warm = max(1, warm)
    server._serving = _serving
    while len(_warm) < _keep_warm:
        _warm.append(_spawn(load_library))
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """TVM's server listens in a child of the command's process; if that process is killed
    (even by SIGKILL), take the sessions' processes down and leave."""
    from tvm.support.popen_pool import kill_child_processes

    while os.getppid() == parent:
        time.sleep(1.0)
    kill_child_processes(os.getpid())
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pipeline.rpc_server", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="0.0.0.0", help="address to bind")
    ap.add_argument("--port", type=int, default=9090, help="first port to try")
    ap.add_argument("--port-end", type=int, default=9199, help="last port to try")
    ap.add_argument("--tracker", help="the RPC tracker, HOST:PORT")
    ap.add_argument("--key", default="", help="the device key the tracker hands out (e.g. gpu)")
    ap.add_argument("--custom-addr", help="the address to report to the tracker")
    ap.add_argument("--load-library", help="an extra library each session loads")
    ap.add_argument("--warm", type=int, default=4, help="session processes kept ready (default 4)")
    ap.add_argument("--silent", action="store_true")
    a = ap.parse_args(argv)
    if a.warm < 1:
        ap.error(f"--warm must be >= 1, got {a.warm}")
    tracker = None
    if a.tracker:
        host, _, port = a.tracker.rpartition(":")
        if not host or not port.isdigit():
            ap.error(f"--tracker must be HOST:PORT, got {a.tracker!r}")     # exit 2
        if not a.key:
            ap.error("--key is required with --tracker")
        tracker = (host, int(port))
    import functools
    import importlib
    import logging

    from tvm import rpc

    # the callback by its module's import name (not __main__), so TVM's server process and the
    # sessions' spawned processes import this module rather than receive copies of it
    here = importlib.import_module(__spec__.name if __spec__ else "pipeline.rpc_server")

    logging.basicConfig(level=logging.INFO)
    server = rpc.Server(a.host, a.port, a.port_end, key=a.key, tracker_addr=tracker, load_library=a.load_library,
                        custom_addr=a.custom_addr, silent=a.silent, no_fork=True,
                        server_init_callback=functools.partial(here.install, a.warm, a.load_library))
    print(f"rpc server (warm sessions) on port {server.port}", file=sys.stderr, flush=True)

    def stop(*_):
        server.terminate()      # TVM's worker kill: the listening process and its children
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.proc.join()


if __name__ == "__main__":
    main()
