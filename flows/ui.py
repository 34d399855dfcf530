"""One command for the Prefect UI: start a local Prefect server (SQLite, loopback) and serve
the deployments; open http://127.0.0.1:4200 and click Run on `little-dragon-pipeline/pipeline`.

    make ui          (or: .venv/bin/python -m flows.ui [--port 4200])

Ctrl-C stops both. The server's database and logs live in .prefect/ (ignored by git).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from flows import local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=4200)
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    home = root / ".prefect"
    env = local.environment(args.port, home, root, ui=True)
    print(f"starting the Prefect server on http://127.0.0.1:{args.port} (log: {home / 'server.log'}) ...", flush=True)
    server = local.start_server(args.port, root, env, home / "server.log")
    try:
        os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "PREFECT_HOME", "LITTLE_DRAGON_ROOT")})
        print(f"Prefect UI: http://127.0.0.1:{args.port}  - serving the deployments (Ctrl-C stops)", flush=True)
        from flows.serve import main as serve

        serve()
    finally:
        local.stop(server)


if __name__ == "__main__":
    main()
