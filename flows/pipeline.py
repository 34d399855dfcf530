"""Prefect flows over the DVC stages: the whole pipeline and one flow per stage group.

Every flow takes `profile` (None: params.yaml as it is; "cpu", "gpu", "tiny": profiles/<name>.yaml)
and `overrides` ({"rl.steps": 8, ...}: dotted keys). For the run, they are written into
params.yaml, so DVC records in dvc.lock the values each stage ran with (as `dvc exp run
--set-param` does); when the flow ends, failed or not, the user's own params.yaml is put back
byte for byte, so a later `make repro` runs the user's parameters, never the last UI run's.
"""

from __future__ import annotations

import contextlib
import shutil
from typing import Any

import yaml
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.stages import project_root, run_stage, stages_of


def _stages(flow_name: str) -> list[str]:
    """The stages a flow runs, in dvc.yaml's order (dvc.yaml's `meta.flow` names the flow):
    the stage graph lives in dvc.yaml alone."""
    return stages_of(flow_name)


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


@contextlib.contextmanager
def params_for_run(profile: str | None, overrides: dict[str, Any] | None):
    """Apply a profile and overrides to params.yaml for the duration of a flow run only."""
    target = project_root() / "params.yaml"
    original = target.read_bytes()
    try:
        yield apply_params(profile, overrides)
    finally:
        if profile or overrides:
            target.write_bytes(original)


def with_cluster(overrides: dict[str, Any] | None, cluster: str | None = None,
                 rpc_tracker: str | None = None) -> dict[str, Any] | None:
    """The flows' cluster parameters as params overrides: `cluster` (a Dask scheduler
    address) for the corpus, search and evaluation stages' jobs, `rpc_tracker` (host:port of TVM's RPC
    tracker) for the search stage's measurements."""
    out = dict(overrides or {})
    if cluster:
        out.update({"corpus.cluster": cluster, "search.cluster": cluster, "evaluate.cluster": cluster})
    if rpc_tracker:
        out.update({"search.runner": "rpc", "search.rpc_tracker": rpc_tracker})
    return out or None


def _run(stages: list[str]) -> dict:
    return {s: run_stage(s) for s in stages}


@flow(name="search", log_prints=True)
def search_flow(profile: str | None = None, overrides: dict[str, Any] | None = None,
                cluster: str | None = None, rpc_tracker: str | None = None) -> dict:
    """MetaSchedule search over the catalog (catalog, search, codec report); `cluster`: the
    Dask scheduler whose workers tune the shards; `rpc_tracker` measures on the RPC servers
    registered with that tracker."""
    with params_for_run(profile, with_cluster(overrides, cluster, rpc_tracker)):
        return _run(_stages("search"))


@flow(name="data", log_prints=True)
def data_flow(profile: str | None = None, overrides: dict[str, Any] | None = None,
              cluster: str | None = None) -> dict:
    """The pre-training corpus and training examples from the search records, validated with
    Great Expectations; `cluster` runs the corpus shards on that Dask scheduler."""
    with params_for_run(profile, with_cluster(overrides, cluster)):
        return _run(_stages("data"))


@flow(name="train", log_prints=True)
def train_flow(profile: str | None = None, overrides: dict[str, Any] | None = None) -> dict:
    """SFT, then RL with the measured reward."""
    with params_for_run(profile, overrides):
        return _run(_stages("train"))


@flow(name="evaluate-and-register", log_prints=True)
def evaluate_flow(profile: str | None = None, overrides: dict[str, Any] | None = None,
                  fail_on_gate: bool = False) -> dict:
    """Gated evaluation; registers every model in MLflow, champion only when the gates pass."""
    with params_for_run(profile, overrides):
        out = _run(_stages("evaluate-and-register"))
    gate = out["evaluate"].get("gate", {})
    if fail_on_gate and not gate.get("passed"):
        raise GateFailed("gate failed: " + "; ".join(gate.get("reasons", [])))
    return out


@flow(name="little-dragon-pipeline", log_prints=True)
def pipeline_flow(profile: str | None = None, overrides: dict[str, Any] | None = None,
                  fail_on_gate: bool = False, cluster: str | None = None, rpc_tracker: str | None = None) -> dict:
    """The whole pipeline: search -> data -> train -> evaluate-and-register (`cluster`: a Dask
    scheduler for the corpus shards; `rpc_tracker`: TVM's RPC tracker for search measurements)."""
    log = get_run_logger()
    with params_for_run(profile, with_cluster(overrides, cluster, rpc_tracker)) as applied:
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
