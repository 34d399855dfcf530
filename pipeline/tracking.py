"""MLflow: where runs go, and one call to log a stage's run.

Embedded default: a SQLite store `mlflow.db` and the artifact folder `mlruns/` in the project
(both ignored by git); `MLFLOW_TRACKING_URI` points everything at a server instead."""

from __future__ import annotations

import json
import os
from pathlib import Path

EXPERIMENT = "little-dragon"
DEFAULT_URI = "sqlite:///mlflow.db"


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


def log_run(run_name: str, params: dict, metrics: dict, curves, artifacts: list[str]) -> str:
    """curves: (metric name, step, value) triples. Returns the run id."""
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
