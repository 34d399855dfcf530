"""The MLflow model registry: every evaluated model becomes a version of `little-dragon`;
the alias `champion` moves only to a version that passed every gate.

A version holds the model as an MLflow pyfunc (`mlflow.pyfunc.load_model` gives a model whose
`predict` takes prompts and returns scripts) with the model directory inside it; a LoRA
adapter's version says, in its tags, which base directory it needs. A version that fails a
gate is tagged `gate=failed` and `gate_reasons`; the previous champion stays.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pipeline import files, models, tracking

NAME = "little-dragon"
ALIAS = "champion"


class RegistryError(RuntimeError):
    """Nothing to pull, or a store that cannot be reached."""


try:
    import mlflow.pyfunc

    class ScriptWriter(mlflow.pyfunc.PythonModel):
        """A DataFrame -> one list of scripts per row. Columns: `kernel` (TVMScript of the
        kernel) and `target` (JSON or a tag; default LLVM) for guided decoding (the default:
        every script valid and complete for that kernel); `prompt` overrides the construction
        prompt built from the kernel (e.g. a refinement prompt). A row with no kernel can only
        be sampled freely, from its `prompt`."""

        def load_context(self, context):
            self.model, self.tokenizer = models.load(context.artifacts["model"])

        def predict(self, context, model_input, params=None):
            from dataclasses import replace

            from pipeline.generate import GenerationParams, generate

            rows = (model_input.to_dict("records") if hasattr(model_input, "to_dict")
                    else [{"prompt": p} for p in model_input])
            g = GenerationParams(**{k: v for k, v in (params or {}).items() if k in GenerationParams.__annotations__})
            out = []
            for r in rows:
                kernel = r.get("kernel")
                if isinstance(kernel, str) and kernel.strip():
                    mod, target, prompt = _kernel_prompt(kernel, r.get("target"), r.get("prompt"))
                    out.append(generate(self.model, self.tokenizer, [prompt], g, kernels=[(mod, target)]).scripts[0])
                else:
                    out.append(generate(self.model, self.tokenizer, [r["prompt"]], replace(g, guided=False)).scripts[0])
            return out

except ImportError:  # mlflow is a dependency; this keeps `import pipeline.registry` cheap to fail
    ScriptWriter = None


def _kernel_prompt(kernel: str, target_spec, prompt):
    """TVMScript text -> (module, target, prompt): what guided decoding needs for a row."""
    from pipeline.describe import describe
    from pipeline.prompts import construction_prompt
    from pipeline.tvm_env import make_target, tvm

    parsed = tvm.script.from_source(kernel)
    mod = parsed if isinstance(parsed, tvm.IRModule) else tvm.IRModule({"main": parsed})
    target = make_target(target_spec if isinstance(target_spec, str) and target_spec else
                         {"kind": "llvm", "num-cores": 2})
    return mod, target, prompt if isinstance(prompt, str) and prompt else construction_prompt(describe(mod), target.kind.name)


def _client():
    from mlflow import MlflowClient

    tracking.setup()
    return MlflowClient(tracking.tracking_uri())


def register(label: str, model_dir: str, params: dict, metrics: dict, curves, artifacts: list[str],
             gate: dict) -> dict:
    """Log the model with its evaluation to a new run, register it as a new version, tag the
    gate decision. Does not move the alias (promote does). Returns {run_id, version, ...}."""
    mlflow = tracking.setup()
    base = models.base_of(model_dir)
    digest = model_digest(model_dir)
    # Idempotent: a retried evaluation of the same model files registers nothing twice.
    for v in _client().search_model_versions(f"name='{NAME}'"):
        if v.tags.get("model_sha256") == digest and v.tags.get("model_label") == label:
            return {"label": label, "run_id": v.run_id, "version": int(v.version), "gate": gate,
                    "base_model": base, "already_registered": True}
    tags = {"model_label": label, "gate": "passed" if gate["passed"] else "failed",
            "base_model": base or "none (full model)", "model_sha256": digest}
    with mlflow.start_run(run_name=f"evaluate-{label}") as run:
        tracking.log_to_active_run(params, metrics, curves, artifacts)
        mlflow.set_tags(tags)
        import pandas as pd
        from mlflow.models import infer_signature

        from mlflow.types.schema import ColSpec, Schema

        signature = infer_signature(pd.DataFrame({"prompt": ["target: llvm ..."]}), ["B main ..."],
                                    params={"attempts": 4, "temperature": 0.8, "top_p": 0.95, "max_new_tokens": 640,
                                            "guided": True})
        signature.inputs = Schema([ColSpec("string", name, required=False) for name in ("prompt", "kernel", "target")])
        info = mlflow.pyfunc.log_model(
            name="model", python_model=ScriptWriter(), artifacts={"model": str(model_dir)}, signature=signature,
            pip_requirements=["little-dragon", "torch", "transformers", "peft", "apache-tvm"])
        run_id = run.info.run_id
    version = mlflow.register_model(info.model_uri, NAME)
    client = _client()
    tags["run_id"] = run_id
    if not gate["passed"]:
        tags["gate_reasons"] = "; ".join(gate["reasons"])[:4000]
    for k, v in tags.items():
        client.set_model_version_tag(NAME, version.version, k, v)
    return {"label": label, "run_id": run_id, "version": int(version.version), "gate": gate,
            "base_model": base}


def model_digest(model_dir: str | Path) -> str:
    """SHA-256 over a model folder's files (names and contents): the identity of a model."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        h.update(str(path.relative_to(model_dir)).encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def champion() -> dict | None:
    client = _client()
    try:
        v = client.get_model_version_by_alias(NAME, ALIAS)
    except Exception:  # no registered model, or no alias yet (MlflowException)
        return None
    return {"version": int(v.version), "run_id": v.run_id, "tags": dict(v.tags)}


def promote(version: int) -> None:
    _client().set_registered_model_alias(NAME, ALIAS, str(version))


def pull(dest: str | Path, alias: str = ALIAS) -> Path:
    """Download `models:/little-dragon@champion` and copy its model directory to `dest`."""
    import mlflow

    tracking.setup()
    if champion() is None:
        raise RegistryError(f"no version of '{NAME}' holds the alias '{alias}' in {tracking.tracking_uri()}: "
                            "no evaluated model has passed the gates yet (see reports/metrics.json)")
    dest = Path(dest)
    if dest.exists() and not models.is_model_dir(dest):
        raise RegistryError(f"{dest} exists and is not a model folder (no config.json or adapter_config.json): "
                            "refusing to replace it; pass --dest with a new or model folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.download-"))
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{NAME}@{alias}", dst_path=str(staging)))
        found = [p.parent for p in local.rglob("config.json")] + [p.parent for p in local.rglob("adapter_config.json")]
        if not found:
            raise RegistryError(f"models:/{NAME}@{alias} holds no model directory")
        new = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.new-"))
        new.rmdir()
        shutil.copytree(found[0], new)
        files.swap_dir(new, dest)     # the old champion stays until the new one is complete
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
