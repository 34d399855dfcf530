"""Small file helpers shared by the stages: atomic writes, JSON lines."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator


def write_text_atomic(path: Path | str, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path | str, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_keyed(path: Path | str, key: Any) -> Any:
    """The value `write_keyed` kept in `path` for exactly this `key`; None if the file is
    missing, unreadable or kept for another key (a cache of work that is slow to redo)."""
    try:
        kept = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return kept.get("value") if isinstance(kept, dict) and kept.get("key") == key else None


def write_keyed(path: Path | str, key: Any, value: Any) -> None:
    write_json(path, {"key": key, "value": value})


def source_digest(*paths: Path | str) -> str:
    """A short digest of source files (a cache of their results is stale once they change)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def write_jsonl(path: Path | str, rows: Iterable[Any]) -> int:
    lines = [json.dumps(r, separators=(",", ":")) for r in rows]
    write_text_atomic(path, "\n".join(lines) + ("\n" if lines else ""))
    return len(lines)


def append_jsonl(path: Path | str, row: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row, separators=(",", ":")) + "\n")


def read_jsonl(path: Path | str) -> Iterator[Any]:
    """Rows of a JSON-lines file; a torn last line (an interrupted append) is skipped."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def save_model_dir(model, tokenizer, dest: Path | str, bf16: bool = False) -> Path:
    """Save a model and its tokenizer into a fresh folder beside `dest`, then swap it in: no
    file of an earlier model (a LoRA run's adapter_config.json, say) survives, and an
    interruption leaves the old model in place. Safetensors shards of at most 20 MB (a model
    trained on a lent machine comes back in pieces); `bf16`: the weights are cast to bfloat16
    first (the model trained in bf16 mixed precision, shipped at half the size)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.new-"))
    if bf16:
        import torch

        model.to(torch.bfloat16)
    model.save_pretrained(new, max_shard_size="20MB")
    tokenizer.save_pretrained(new)
    _sort_target_modules(new / "adapter_config.json")
    swap_dir(new, dest)
    return dest


def _sort_target_modules(path: Path) -> None:
    """PEFT writes a LoRA adapter's `target_modules` in a set's order, which changes from process
    to process: sorted, the same adapter gives the same files, so the same model digest (the key
    of the evaluation's kept results)."""
    if not path.exists():
        return
    cfg = json.loads(path.read_text())
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
        write_json(path, cfg)


def swap_dir(new: Path, dest: Path) -> None:
    """Replace folder `dest` by folder `new` (same file system) with two renames."""
    import shutil

    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
        old.rmdir()
        dest.rename(old)
    new.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
