"""Prefect tasks that run DVC stages, and the markdown each stage publishes.

Each task runs `dvc repro --single-item <stage>`: DVC decides whether the stage is up to date
(it is skipped when its code, data and params are unchanged) and records what ran in dvc.lock.
The stage's output streams into the Prefect log line by line. A failed stage raises
`StageFailed` with the stage's own last lines, so the message shows in the Prefect UI.
Retries happen only for transient failures (a busy MLflow server, a dropped connection),
never for a failed validation, a failed gate or a bug.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

TRANSIENT = re.compile(
    r"(Connection ?(refused|reset|aborted)|ConnectionError|Temporary failure in name resolution|"
    r"Max retries exceeded|Read timed out|database is locked|503 Service Unavailable|502 Bad Gateway|"
    r"TOO_MANY_REQUESTS|429 Client Error|RemoteDisconnected)", re.IGNORECASE)


class StageFailed(RuntimeError):
    """A DVC stage exited non-zero; the message holds the stage's last output lines."""

    def __init__(self, stage: str, code: int, tail: str, transient: bool):
        self.stage, self.code, self.transient = stage, code, transient
        kind = "transient failure, will be retried" if transient else "failed"
        super().__init__(f"stage '{stage}' {kind} (exit {code}):\n{tail}")


def is_transient(task, task_run, state) -> bool:
    """Prefect retry condition: retry only StageFailed marked transient."""
    try:
        state.result()
    except StageFailed as err:
        return err.transient
    except Exception:
        return False
    return False


def project_root() -> Path:
    return Path(os.environ.get("LITTLE_DRAGON_ROOT", Path(__file__).resolve().parent.parent))


def stage_graph(root: Path | None = None) -> dict[str, dict]:
    """dvc.yaml's stages in their order, each with its flow (`meta.flow`) and report (its first
    metrics file): the one description of the pipeline that flows and DVC share."""
    import yaml

    stages = yaml.safe_load(((root or project_root()) / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, st in stages.items():
        metrics = [next(iter(m)) if isinstance(m, dict) else m for m in st.get("metrics", [])]
        out[name] = {"flow": (st.get("meta") or {}).get("flow"), "report": metrics[0] if metrics else None}
    return out


def stages_of(flow_name: str) -> list[str]:
    names = [n for n, st in stage_graph().items() if st["flow"] == flow_name]
    if not names:
        raise ValueError(f"no stage of dvc.yaml has meta.flow = {flow_name!r}")
    return names


def _env() -> dict:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    # the stages run this project's code (a copy of the project may sit beside the installed one)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project_root()), env.get("PYTHONPATH")]))
    env.update({"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "GX_ANALYTICS_ENABLED": "false",
                "DVC_NO_ANALYTICS": "1", "MLFLOW_ENABLE_TELEMETRY": "false", "PYTHONUNBUFFERED": "1"})
    return env


@task(retries=2, retry_delay_seconds=15, retry_condition_fn=is_transient, task_run_name="dvc repro {stage}")
def run_stage(stage: str) -> dict:
    """`dvc repro --single-item <stage>` in the project root; returns the stage's report."""
    log = get_run_logger()
    root = project_root()
    cmd = [str(Path(sys.executable).parent / "dvc"), "repro", "--single-item", stage]
    log.info("running %s in %s", " ".join(cmd), root)
    tail: deque[str] = deque(maxlen=25)
    transient = False
    proc = subprocess.Popen(cmd, cwd=root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            tail.append(line)
            transient = transient or bool(TRANSIENT.search(line))
            log.info("%s | %s", stage, line)
    code = proc.wait()
    if code != 0:
        raise StageFailed(stage, code, "\n".join(tail), transient)
    summary = summarize(stage, root)
    publish(stage, summary)
    return summary


# ---------------------------------------------------------------------------------------
# What each stage publishes (a markdown artifact with its key figures)
# ---------------------------------------------------------------------------------------

def _read(root: Path, rel: str) -> dict:
    path = root / rel
    return json.loads(path.read_text()) if path.exists() else {}


def _table(rows: list[tuple]) -> str:
    out = ["| figure | value |", "|---|---|"]
    for k, v in rows:
        if isinstance(v, float):
            v = f"{v:.4g}"
        out.append(f"| {k} | {v} |")
    return "\n".join(out)


def summarize(stage: str, root: Path) -> dict:
    """The key figures of a finished stage, from the report dvc.yaml declares for it."""
    report = stage_graph(root).get(stage, {}).get("report")
    r = _read(root, report) if report else {}
    if stage == "search":
        rows = [(w["id"], f"{w['trials']} trials, {w['failed']} failed, best {w['best_s'] * 1e6:.1f} us "
                 f"({w['speedup']:.2f}x vs baseline)" if w.get("best_s") and w.get("speedup") else f"{w['trials']} trials")
                for w in r.get("per_workload", [])]
        return {"rows": [("trials", r.get("trials")), ("failed trials", r.get("failed_trials")),
                         ("best vs baseline, geomean", r.get("speedup_geomean_vs_baseline")), *rows]}
    if stage == "data":
        return {"rows": [("records", r.get("records")), ("examples", r.get("examples")),
                         ("by split", json.dumps(r.get("by_split"))), ("corpus scripts", r.get("corpus_scripts"))]}
    if stage == "validate":
        return {"rows": [("validation", "passed" if r.get("success") else "FAILED"), ("examples", r.get("examples")),
                         ("failed expectations", ", ".join(map(str, r.get("failed_expectations", []))) or "none")]}
    if stage == "sft":
        v = r.get("validation", {})
        return {"rows": [("model", r.get("model")), ("parameters", r.get("parameters")),
                         ("train seconds", r.get("train_seconds")), ("final loss", r.get("final_loss")),
                         ("construction correctness (val)", v.get("construction", {}).get("correctness")),
                         ("refinement correctness (val)", v.get("refinement", {}).get("correctness")),
                         ("MLflow run", r.get("mlflow_run_id"))]}
    if stage == "rl":
        return {"rows": [("GRPO steps", r.get("steps")), ("train seconds", r.get("train_seconds")),
                         ("scripts checked", r.get("checked_scripts")),
                         ("mean reward, first half", r.get("reward_first_half")),
                         ("mean reward, second half", r.get("reward_second_half")),
                         ("stages", json.dumps(r.get("stages"))), ("MLflow run", r.get("mlflow_run_id"))]}
    if stage == "evaluate":
        m = r
        rows = [("candidate", m.get("candidate")),
                ("construction correctness", m.get("construction", {}).get("correctness")),
                ("refinement correctness", m.get("refinement", {}).get("correctness")),
                ("construction speedup (geomean)", m.get("construction", {}).get("speedup_geomean")),
                ("latency / MetaSchedule at equal budget", m.get("vs_metaschedule", {}).get("latency_ratio")),
                ("RL vs SFT", json.dumps(m.get("rl_vs_sft"))),
                ("gate", "passed" if m.get("gate", {}).get("passed") else
                 "failed: " + "; ".join(m.get("gate", {}).get("reasons", [])))]
        reg = m.get("registry") or {}
        uri = os.environ.get("MLFLOW_UI_URL", "http://127.0.0.1:5000")
        for v in reg.get("versions", []):
            rows.append((f"MLflow: {v['label']}", f"version {v['version']}, [run {v['run_id'][:8]}]"
                                                   f"({uri}/#/experiments/runs/{v['run_id']})"))
        rows.append(("champion", reg.get("champion")))
        return {"rows": rows, "gate": m.get("gate", {})}
    if stage == "corpus":
        return {"rows": [(t, f"{v['scripts']} scripts over {v['workloads']} workloads, "
                             f"{v['compressed_bytes'] / 1e6:.1f} MB in {v['shards']} shards")
                         for t, v in r.get("targets", {}).items()]
                + [("shards written this run", r.get("shards_written"))]}
    if stage == "codec_report":
        return {"rows": [("exact round trips", f"{r.get('exact_round_trips')}/{r.get('traces')}"),
                         ("chars vs as_python", (r.get("ratio_to_python") or {}).get("chars"))]}
    return {"rows": []}


def publish(stage: str, summary: dict) -> None:
    key = re.sub(r"[^a-z0-9-]", "-", f"little-dragon-{stage}".lower())
    create_markdown_artifact(markdown=f"### {stage}\n\n" + _table(summary["rows"]), key=key,
                             description=f"key figures of the {stage} stage")
