"""Prefect flows over the DVC stages: the whole pipeline and one flow per stage group.

Every flow takes `profile` (None: params.yaml as it is; "cpu", "gpu", "tiny": profiles/<name>.yaml
is copied over params.yaml) and `overrides` ({"rl.steps": 8, ...}: dotted keys written into
params.yaml). DVC records the values each stage ran with in dvc.lock, as `dvc exp run
--set-param` would, and `dvc repro` reproduces them.
"""

from __future__ import annotations

import shutil
from typing import Any

import yaml
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.stages import project_root, run_stage

SEARCH = ["catalog", "search", "codec_report"]
DATA = ["data", "validate"]
TRAIN = ["sft", "rl"]
EVALUATE = ["evaluate"]


class GateFailed(RuntimeError):
    """The candidate model failed a gate (raised only with fail_on_gate=True; never retried)."""


def apply_params(profile: str | None, overrides: dict[str, Any] | None) -> dict:
    """Write the profile and the overrides into params.yaml; returns what was applied."""
    root = project_root()
    target = root / "params.yaml"
    if profile:
        source = root / "profiles" / f"{profile}.yaml"
        if not source.exists():
            names = sorted(p.stem for p in (root / "profiles").glob("*.yaml"))
            raise ValueError(f"unknown profile {profile!r}; profiles: {names}")
        shutil.copyfile(source, target)
    if overrides:
        params = yaml.safe_load(target.read_text())
        for dotted, value in overrides.items():
            node = params
            *path, last = dotted.split(".")
            for k in path:
                if not isinstance(node.get(k), dict):
                    raise ValueError(f"override {dotted!r}: params.yaml has no section {k!r}")
                node = node[k]
            if last not in node:
                raise ValueError(f"override {dotted!r}: params.yaml has no key {last!r} there")
            node[last] = value
        target.write_text("# written by a Prefect flow run (profile %s, overrides %s)\n%s"
                          % (profile, overrides, yaml.safe_dump(params, sort_keys=False)))
    return {"profile": profile, "overrides": overrides or {}}


def _run(stages: list[str]) -> dict:
    return {s: run_stage(s) for s in stages}


@flow(name="search", log_prints=True)
def search_flow(profile: str | None = None, overrides: dict[str, Any] | None = None) -> dict:
    """MetaSchedule search over the catalog (catalog, search, codec report)."""
    apply_params(profile, overrides)
    return _run(SEARCH)


@flow(name="data", log_prints=True)
def data_flow(profile: str | None = None, overrides: dict[str, Any] | None = None) -> dict:
    """Training examples from the search records, validated with Great Expectations."""
    apply_params(profile, overrides)
    return _run(DATA)


@flow(name="train", log_prints=True)
def train_flow(profile: str | None = None, overrides: dict[str, Any] | None = None) -> dict:
    """SFT, then RL with the measured reward."""
    apply_params(profile, overrides)
    return _run(TRAIN)


@flow(name="evaluate-and-register", log_prints=True)
def evaluate_flow(profile: str | None = None, overrides: dict[str, Any] | None = None,
                  fail_on_gate: bool = False) -> dict:
    """Gated evaluation; registers every model in MLflow, champion only when the gates pass."""
    apply_params(profile, overrides)
    out = _run(EVALUATE)
    gate = out["evaluate"].get("gate", {})
    if fail_on_gate and not gate.get("passed"):
        raise GateFailed("gate failed: " + "; ".join(gate.get("reasons", [])))
    return out


@flow(name="little-dragon-pipeline", log_prints=True)
def pipeline_flow(profile: str | None = None, overrides: dict[str, Any] | None = None,
                  fail_on_gate: bool = False) -> dict:
    """The whole pipeline: search -> data -> train -> evaluate-and-register."""
    log = get_run_logger()
    applied = apply_params(profile, overrides)
    log.info("parameters: %s", applied)
    results = {}
    results.update(search_flow())
    results.update(data_flow())
    results.update(train_flow())
    results.update(evaluate_flow(fail_on_gate=fail_on_gate))
    gate = results["evaluate"].get("gate", {})
    create_markdown_artifact(
        key="little-dragon-pipeline",
        markdown="### pipeline\n\n" + "\n".join(
            f"- **{s}**: " + "; ".join(f"{k}: {v if not isinstance(v, float) else f'{v:.4g}'}" for k, v in r["rows"][:4])
            for s, r in results.items()) + f"\n\nGate: **{'passed' if gate.get('passed') else 'failed'}**",
        description="the pipeline run at a glance")
    return {s: r["rows"] for s, r in results.items()}
