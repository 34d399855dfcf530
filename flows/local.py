"""A local Prefect server and the served deployments, as subprocesses: used by `make ui`
(python -m flows.ui), the UI screenshot (python -m flows.demo) and the integration test."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def copy_project(root: Path, dest: Path) -> Path:
    """The project's tracked and untracked (not ignored) files, as a fresh git repository."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for f in filter(None, files):
        src = root / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    git = ["git", "-c", "user.name=little-dragon", "-c", "user.email=little-dragon@localhost"]
    subprocess.run(git + ["init", "-q"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)
    subprocess.run(git + ["commit", "-qm", "copy"], cwd=dest, check=True)
    return dest


def environment(port: int, home: Path, project: Path, ui: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update({"PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "true" if ui else "false",
                "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home}/prefect.db",
                "GX_ANALYTICS_ENABLED": "false", "DVC_NO_ANALYTICS": "1", "MLFLOW_ENABLE_TELEMETRY": "false",
                "LITTLE_DRAGON_ROOT": str(project), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    return env


def start(cmd: list[str], cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    if proc and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def wait_for(predicate, timeout: float, what: str, logs=()):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(2)
    tails = "\n".join(f"--- {p}\n" + Path(p).read_text()[-3000:] for p in logs if Path(p).exists())
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")


def start_server(port: int, cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    import httpx

    proc = start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)], cwd, env, log)

    def healthy():
        if proc.poll() is not None:
            raise RuntimeError(f"the Prefect server exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 180, "the Prefect server", [log])
    return proc


async def run_deployment_like_the_ui(name: str, parameters: dict, timeout: float = 3600, poll: float = 3.0):
    """Create a flow run from the deployment (what the UI's Run button does) and wait for a
    final state. The PREFECT_API_URL of this process selects the server."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        end = time.time() + 180
        while True:
            try:
                dep = await client.read_deployment_by_name(name)
                break
            except Exception:
                if time.time() > end:
                    raise TimeoutError(f"deployment {name!r} never appeared: is `python -m flows.serve` running?")
                await asyncio.sleep(2)
        run = await client.create_flow_run_from_deployment(dep.id, parameters=parameters)
        end = time.time() + timeout
        while time.time() < end:
            run = await client.read_flow_run(run.id)
            if run.state and run.state.is_final():
                return run
            await asyncio.sleep(poll)
        raise TimeoutError(f"flow run {run.id} did not finish in {timeout:.0f} s")
