"""Prefect orchestration, for real: a Prefect server on loopback (SQLite), the deployments
served from a copy of the project, a run triggered through the API exactly as the UI's Run
button does (create a flow run from the deployment), the DVC outputs and the MLflow registry
it produced; a failing stage fails its run with the stage's own message and is not retried."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_apply_params_profile_and_overrides(tmp_path, monkeypatch):
    from flows.pipeline import apply_params

    (tmp_path / "profiles").mkdir()
    shutil.copy(ROOT / "profiles" / "tiny.yaml", tmp_path / "profiles" / "tiny.yaml")
    (tmp_path / "params.yaml").write_text("rl: {steps: 1}\n")
    monkeypatch.setenv("LITTLE_DRAGON_ROOT", str(tmp_path))
    apply_params("tiny", {"rl.steps": 7, "evaluate.gates.min_speedup": 1.5})
    p = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert p["rl"]["steps"] == 7 and p["evaluate"]["gates"]["min_speedup"] == 1.5 and p["search"]["num_workloads"] == 3
    with pytest.raises(ValueError, match="no key 'stepz'"):
        apply_params(None, {"rl.stepz": 1})
    with pytest.raises(ValueError, match="unknown profile"):
        apply_params("nope", None)


def test_cpu_profile_is_the_default_params():
    assert yaml.safe_load((ROOT / "profiles" / "cpu.yaml").read_text()) == yaml.safe_load((ROOT / "params.yaml").read_text())


def test_only_transient_failures_are_retried():
    from flows.stages import TRANSIENT

    assert TRANSIENT.search("requests.exceptions.ConnectionError: HTTPConnectionPool Max retries exceeded")
    assert TRANSIENT.search("sqlite3.OperationalError: database is locked")
    assert not TRANSIENT.search("little-dragon validate: 2 expectations failed: expect_table_row_count_to_be_between")


# ---------------------------------------------------------------------------------------

@pytest.mark.integration
def test_ui_run_button_runs_the_whole_pipeline(tmp_path):
    import asyncio

    from flows import local

    work = local.copy_project(ROOT, tmp_path / "project")
    port = local.free_port()
    env = local.environment(port, tmp_path / "prefect", work, ui=False)
    logs = [tmp_path / "server.log", tmp_path / "serve.log"]
    server = serve = None
    try:
        server = local.start_server(port, work, env, logs[0])
        serve = local.start([sys.executable, "-m", "flows.serve"], work, env, logs[1])
        os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "PREFECT_HOME")})

        async def artifacts_and_task_runs(run_id):
            from prefect.client.orchestration import get_client
            from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

            async with get_client() as client:
                arts = await client.read_artifacts(
                    artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="little-dragon")))
                tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
                return arts, tasks

        users_params = (work / "params.yaml").read_bytes()
        run = asyncio.run(local.run_deployment_like_the_ui("little-dragon-pipeline/pipeline", {"profile": "tiny"},
                                                           timeout=1500))
        assert run.state.is_completed(), f"{run.state.type}: {run.state.message}\n" + logs[1].read_text()[-4000:]
        # the run used the profile (dvc.lock records it) and left the user's params.yaml as it was
        assert (work / "params.yaml").read_bytes() == users_params
        lock = yaml.safe_load((work / "dvc.lock").read_text())
        tiny = yaml.safe_load((work / "profiles" / "tiny.yaml").read_text())
        assert lock["stages"]["rl"]["params"]["params.yaml"]["rl"]["steps"] == tiny["rl"]["steps"]
        shutil.copyfile(work / "profiles" / "tiny.yaml", work / "params.yaml")   # to ask DVC about that run
        # the DVC outputs, and DVC agrees they are up to date
        assert (work / "models" / "rl" / "config.json").exists() and (work / "models" / "sft" / "config.json").exists()
        metrics = yaml.safe_load((work / "reports" / "metrics.json").read_text())
        for key in ("construction", "refinement", "vs_metaschedule", "rl_vs_sft", "gate"):
            assert key in metrics
        status = subprocess.run([str(BIN / "dvc"), "status"], cwd=work, capture_output=True, text=True, env=env)
        assert "up to date" in status.stdout, status.stdout
        (work / "params.yaml").write_bytes(users_params)
        # the MLflow registry: both models registered, each tagged with its gate decision
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{work}/mlflow.db")
        versions = client.search_model_versions("name='little-dragon'")
        assert len(versions) == 2 and {v.tags["model_label"] for v in versions} == {"sft", "rl"}
        assert all(v.tags["gate"] in ("passed", "failed") for v in versions)
        arts, _ = asyncio.run(artifacts_and_task_runs(run.id))
        assert {"little-dragon-search", "little-dragon-validate", "little-dragon-sft", "little-dragon-evaluate",
                "little-dragon-pipeline"} <= {a.key for a in arts}

        # A failing stage (validation refuses the data) fails its run with the stage's message; no retry.
        run = asyncio.run(local.run_deployment_like_the_ui("data/data", {"overrides": {"validate.min_examples": 10**9}},
                                                           timeout=600))
        assert run.state.is_failed()
        assert (work / "params.yaml").read_bytes() == users_params     # put back after a failure too
        assert "validate" in (run.state.message or "") or "validate" in logs[1].read_text()
        _, task_runs = asyncio.run(artifacts_and_task_runs(run.id))
        failed = [t for t in task_runs if t.state and t.state.is_failed()]
        assert failed and all(t.run_count == 1 for t in failed)   # not retried
    finally:
        local.stop(serve)
        local.stop(server)


def test_flows_take_the_cluster_addresses_as_parameters(tmp_path, monkeypatch):
    """A flow run's `cluster` / `rpc_tracker` become the params the corpus and search read."""
    import inspect

    from flows.pipeline import data_flow, pipeline_flow, search_flow, with_cluster
    from pipeline.params import from_dict
    from pipeline.stages.search import SearchParams

    assert "cluster" in inspect.signature(data_flow.fn).parameters
    assert {"cluster", "rpc_tracker"} <= set(inspect.signature(search_flow.fn).parameters)
    assert {"cluster", "rpc_tracker"} <= set(inspect.signature(pipeline_flow.fn).parameters)
    out = with_cluster({"rl.steps": 2}, "tcp://10.0.0.5:8786", "10.0.0.6:9190")
    assert out == {"rl.steps": 2, "corpus.cluster": "tcp://10.0.0.5:8786", "search.cluster": "tcp://10.0.0.5:8786",
                   "evaluate.cluster": "tcp://10.0.0.5:8786", "search.runner": "rpc", "search.rpc_tracker": "10.0.0.6:9190"}
    assert with_cluster(None) is None
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())["search"]
    p = from_dict(SearchParams, {**raw, "runner": "rpc", "rpc_tracker": "10.0.0.6:9190"})
    assert p.runner == "rpc"
    from flows.pipeline import apply_params

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.setenv("LITTLE_DRAGON_ROOT", str(tmp_path))
    apply_params(None, out)                     # every profile has the keys the overrides set
    written = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert written["corpus"]["cluster"] == "tcp://10.0.0.5:8786" and written["search"]["runner"] == "rpc"
