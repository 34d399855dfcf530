"""The README's screenshot, for real: in a copy of the project, start a Prefect server with
its UI, serve the deployments, run the pipeline on the tiny profile through the API (as the
Run button does), then photograph the finished run's page with headless Chromium.

    .venv/bin/python -m flows.demo [--profile tiny] [--out reports/prefect_ui.png]

Needs Debian's `chromium` package (apt-get install chromium).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from flows import local


def screenshot(url: str, out: Path, size: str = "1600,1000", wait_ms: int = 20000) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("flows.demo: chromium is not installed (apt-get install chromium)")
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={size}", f"--virtual-time-budget={wait_ms}", f"--screenshot={out.resolve()}", url],
                   check=True, capture_output=True, timeout=180)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--out", default="reports/prefect_ui.png")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="little-dragon-demo-") as tmp:
        tmp = Path(tmp)
        project = local.copy_project(root, tmp / "project")
        port = local.free_port()
        env = local.environment(port, tmp / "prefect", project, ui=True)
        server = serve = None
        try:
            server = local.start_server(port, project, env, tmp / "server.log")
            serve = local.start([sys.executable, "-m", "flows.serve"], project, env, tmp / "serve.log")
            os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "PREFECT_HOME")})
            print(f"running the pipeline ({args.profile} profile) through http://127.0.0.1:{port} ...", flush=True)
            run = asyncio.run(local.run_deployment_like_the_ui("little-dragon-pipeline/pipeline",
                                                               {"profile": args.profile}))
            print(f"flow run {run.name}: {run.state.type.value}", flush=True)
            out = root / args.out
            screenshot(f"http://127.0.0.1:{port}/runs/flow-run/{run.id}", out)
            screenshot(f"http://127.0.0.1:{port}/runs", out.with_name(out.stem + "_runs.png"))
            (out.with_suffix(".json")).write_text(json.dumps(
                {"flow_run": str(run.id), "name": run.name, "state": run.state.type.value,
                 "metrics": json.loads((project / "reports" / "metrics.json").read_text())
                 if (project / "reports" / "metrics.json").exists() else None}, indent=2))
            print(f"screenshots -> {out}, {out.with_name(out.stem + '_runs.png')}")
        finally:
            local.stop(serve)
            local.stop(server)


if __name__ == "__main__":
    main()
