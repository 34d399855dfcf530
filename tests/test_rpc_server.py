"""pipeline.rpc_server: TVM's RPC server with session processes spawned ahead (loopback, CPU).
Its use by a search (the RPC runner through a tracker) is tested in test_search.py."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest


def test_bad_arguments_exit_2(capsys):
    from pipeline import rpc_server

    for argv in (["--tracker", "nohost", "--key", "gpu"], ["--tracker", "127.0.0.1:9190"], ["--warm", "0"]):
        with pytest.raises(SystemExit) as exit_:
            rpc_server.main(argv)
        assert exit_.value.code == 2
        assert "error:" in capsys.readouterr().err


def _connect(port: int, seconds: float = 90):
    from tvm import rpc

    deadline = time.time() + seconds
    while True:
        try:
            return rpc.connect("127.0.0.1", port, session_timeout=60)
        except Exception:   # noqa: BLE001 - the server is still starting
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_a_crashed_session_costs_only_itself_and_nothing_outlives_the_server(tmp_path):
    """A session's process killed mid-session (as a kernel that crashes the process would):
    the server goes on serving the next session; killing the server (SIGKILL, its own process
    only) leaves none of its processes behind."""
    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([sys.executable, "-m", "pipeline.rpc_server", "--host", "127.0.0.1", "--port", str(port),
                            "--port-end", str(port + 5), "--warm", "2"], stdout=open(tmp_path / "server.log", "w"),
                           stderr=subprocess.STDOUT, start_new_session=True)
    try:
        first = _connect(port)
        assert first.cpu(0).exist
        (listening,) = psutil.Process(srv.pid).children()      # TVM's server listens in a child
        serving = [p for p in listening.children() if any(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
                                                          for c in p.net_connections())]
        assert len(serving) == 1
        serving[0].kill()
        second = _connect(port)
        assert second.cpu(0).exist
        assert "exited with code -9" in (tmp_path / "server.log").read_text()
        del first, second
        family = psutil.Process(srv.pid).children(recursive=True)
        srv.kill()                 # the command's process alone, as `kill -9 PID` would
        srv.wait()
        psutil.wait_procs(family, timeout=15)
        assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        try:
            os.killpg(srv.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
