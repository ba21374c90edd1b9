"""Model shapes by preset name or config.json path (the shipped presets: `model_configs/*.json`)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from agentbatch.planning.errors import InputError
from agentbatch.planning.inputs import GIB
from agentbatch.planning.model_shape import ModelShape, shape_from_config

PRESET_PACKAGE = "agentbatch.planning.model_configs"


def presets() -> dict[str, Any]:
    """Preset name -> resource of the shipped config.json files."""
    root = resources.files(PRESET_PACKAGE)
    return {p.name.removesuffix(".json"): p for p in root.iterdir() if p.name.endswith(".json")}


def read_config_json(path: Any, label: str) -> dict[str, Any]:
    """A Hugging Face config.json as a dict, without agentbatch's '_' note keys."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{label}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{label}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(data, dict):
        raise InputError(f"{label}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}")
    return {k: v for k, v in data.items() if not k.startswith("_")}


def load_model_shape(
    spec: str,
    *,
    kv_cache_dtype: str | None = None,
    state_dtype: str | None = None,
    weights_gib: float | None = None,
) -> ModelShape:
    """A config.json path, a directory holding one, or a preset name."""
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    available = presets()
    if path.exists():
        cfg, label = read_config_json(path, str(path)), str(path)
        name = path.parent.name if path.name == "config.json" else path.stem
    elif spec in available:
        cfg, label, name = read_config_json(available[spec], f"preset {spec}"), f"preset {spec}", spec
    else:
        raise InputError(f"--model {spec}: no such file, and not a preset (presets: {', '.join(sorted(available))})")
    return shape_from_config(
        cfg,
        source=label,
        name=name,
        kv_cache_dtype=kv_cache_dtype,
        state_dtype=state_dtype,
        weights_bytes=int(weights_gib * GIB) if weights_gib is not None else None,
    )
