"""`params.yaml` is the one source of truth for parameters; each stage reads its section
into a dataclass whose `__post_init__` rejects bad values with a message saying how to fix them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

PARAMS_FILE = Path("params.yaml")
T = TypeVar("T")


class ParamsError(ValueError):
    """A missing or invalid value in params.yaml."""


def load(section: str, cls: type[T], path: Path | str = PARAMS_FILE) -> T:
    """Read `section` of the params file into `cls` (a dataclass)."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found: run from the project root, or pass --params")
    data = yaml.safe_load(path.read_text()) or {}
    if section not in data:
        raise ParamsError(f"{path} has no '{section}:' section")
    return from_dict(cls, data[section], f"{path}:{section}")


def from_dict(cls: type[T], values: dict[str, Any], where: str = "params") -> T:
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ParamsError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    missing = sorted(f.name for f in dataclasses.fields(cls)
                     if f.name not in values and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    if missing:
        raise ParamsError(f"{where}: missing key(s) {missing}")
    try:
        return cls(**values)
    except ParamsError as err:
        raise ParamsError(f"{where}: {err}") from None


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ParamsError(message)
