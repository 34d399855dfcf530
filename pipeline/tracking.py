"""MLflow: where runs go, and one call to log a stage's run.

Embedded default: a SQLite store `mlflow.db` and the artifact folder `mlruns/` in the project
(both ignored by git); `MLFLOW_TRACKING_URI` points everything at a server instead.

A training machine without MLflow (the lent GPU machines have none), or one told
`LITTLE_DRAGON_MLFLOW=defer`, keeps each run in `mlruns-pending/<time>-<name>/` (its params,
metrics, curves and a copy of its artifacts); `little-dragon mlflow-sync` logs them later
where the store is, so nothing a remote run measured is lost."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

EXPERIMENT = "little-dragon"
DEFAULT_URI = "sqlite:///mlflow.db"
PENDING = Path("mlruns-pending")


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI)


def setup():
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    if mlflow.get_experiment_by_name(EXPERIMENT) is None:
        root = Path("mlruns").resolve()
        mlflow.create_experiment(EXPERIMENT, artifact_location=root.as_uri() if tracking_uri() == DEFAULT_URI else None)
    mlflow.set_experiment(EXPERIMENT)
    return mlflow


def deferred() -> bool:
    return os.environ.get("LITTLE_DRAGON_MLFLOW") == "defer" or importlib.util.find_spec("mlflow") is None


def log_run(run_name: str, params: dict, metrics: dict, curves, artifacts: list[str]) -> str:
    """curves: (metric name, step, value) triples. Returns the run id (or where a deferred run is kept)."""
    if deferred():
        return defer(run_name, params, metrics, curves, artifacts)
    mlflow = setup()
    with mlflow.start_run(run_name=run_name) as run:
        log_to_active_run(params, metrics, curves, artifacts)
        return run.info.run_id


def log_to_active_run(params: dict, metrics: dict, curves, artifacts: list[str]) -> None:
    import mlflow

    mlflow.log_params({k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in params.items()})
    for name, step, value in curves:
        mlflow.log_metric(name, value, step=int(step))
    mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v})
    for a in artifacts:
        if Path(a).exists():
            mlflow.log_artifact(a)


def defer(run_name: str, params: dict, metrics: dict, curves, artifacts: list[str]) -> str:
    """Keep a run for `sync`: its values and a copy of its artifacts, in a folder written whole."""
    PENDING.mkdir(exist_ok=True)
    stem = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{run_name}"
    tmp = PENDING / f".{stem}"
    (tmp / "artifacts").mkdir(parents=True)
    kept = []
    for a in artifacts:
        if Path(a).exists():
            shutil.copy2(a, tmp / "artifacts" / Path(a).name)
            kept.append(Path(a).name)
    (tmp / "run.json").write_text(json.dumps({
        "run_name": run_name, "params": params, "metrics": metrics,
        "curves": [list(c) for c in curves], "artifacts": kept}, default=str))
    tmp.rename(PENDING / stem)
    why = "deferred by LITTLE_DRAGON_MLFLOW" if importlib.util.find_spec("mlflow") else "MLflow is not installed here"
    print(f"mlflow: {why}; run {run_name!r} kept in {PENDING / stem} (log it with `little-dragon mlflow-sync`)")
    return f"pending:{stem}"


def sync() -> list[tuple[str, str]]:
    """Log every kept run to the tracking store, oldest first; each folder is removed once logged.
    Returns (folder name, run id) pairs."""
    done = []
    kept = sorted(d for d in PENDING.glob("*") if d.is_dir() and not d.name.startswith("."))   # none if no folder
    for folder in kept:
        run = json.loads((folder / "run.json").read_text())
        mlflow = setup()
        with mlflow.start_run(run_name=run["run_name"]) as active:
            log_to_active_run(run["params"], run["metrics"], [tuple(c) for c in run["curves"]],
                              [str(folder / "artifacts" / a) for a in run["artifacts"]])
            done.append((folder.name, active.info.run_id))
        shutil.rmtree(folder)
    return done
