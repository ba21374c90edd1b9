"""BFCL's multi-turn backends (file system, Twitter, trading, travel ...) as MCP tools.

One server process holds one set of backend instances, i.e. one sample's state. Start it for a BFCL
task (`--entry multi_turn_base_0`: its classes, initial state and excluded functions) or for plain
classes (`--classes GorillaFileSystem,MathAPI`, optional `--config FILE` with the initial state).
Tool schemas come from bfcl's function docs, with BFCL's "dict"/"float"/"tuple" types mapped to
JSON Schema. A backend that answers {"error": ...} or raises gives an isError result.
`--expose-state` adds the tool `agentbatch_state` (the instances' public attributes, for scoring);
environments hide `agentbatch_*` tools from the model.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
from pathlib import Path
from typing import Any

import mcp_types as types

from agentbatch.environments.mcp_servers._serve import (
    add_transport_args,
    build_server,
    serve,
    text_result,
)

STATE_TOOL = "agentbatch_state"
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def json_schema(schema: Any) -> Any:
    """BFCL parameter schema -> JSON Schema (recursively)."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str) and value in _TYPES:
            if _TYPES[value] is not None:
                out[key] = _TYPES[value]
        elif key in ("properties",) and isinstance(value, dict):
            out[key] = {k: json_schema(v) for k, v in value.items()}
        elif key == "response":
            continue
        else:
            out[key] = json_schema(value)
    return out


def _func_docs(cls_name: str) -> list[dict[str, Any]]:
    import bfcl_eval
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = Path(bfcl_eval.__file__).parent / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls_name]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_entry(entry_id: str) -> dict[str, Any]:
    from bfcl_eval.utils import load_dataset_entry

    category = entry_id.rsplit("_", 1)[0]
    for entry in load_dataset_entry(category):
        if entry["id"] == entry_id:
            return entry
    raise SystemExit(f"no BFCL entry {entry_id!r} in category {category!r}")


class Backends:
    """The instances of one sample and the tools they offer."""

    def __init__(
        self,
        classes: list[str],
        initial_config: dict[str, Any] | None = None,
        excluded: list[str] | None = None,
        long_context: bool = False,
        expose_state: bool = False,
    ) -> None:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.instances: dict[str, Any] = {}
        self.methods: dict[str, tuple[Any, str]] = {}  # tool name -> (instance, method name)
        self.tools: list[types.Tool] = []
        excluded_set = set(excluded or [])
        for cls_name in classes:
            module = importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name])
            obj = getattr(module, cls_name)()
            if cls_name not in STATELESS_CLASSES:
                obj._load_scenario(copy.deepcopy((initial_config or {}).get(cls_name, {})), long_context=long_context)
            self.instances[cls_name] = obj
            for doc in _func_docs(cls_name):
                method = doc["name"]
                if method in excluded_set or not callable(getattr(obj, method, None)):
                    continue
                name = method if method not in self.methods else f"{cls_name}.{method}"
                self.methods[name] = (obj, method)
                self.tools.append(
                    types.Tool(
                        name=name,
                        description=doc.get("description", ""),
                        input_schema=json_schema(doc.get("parameters") or {"type": "object", "properties": {}}),
                    )
                )
        if expose_state:
            self.tools.append(
                types.Tool(
                    name=STATE_TOOL,
                    description="(harness) the backends' public state, for scoring",
                    input_schema={"type": "object", "properties": {}},
                )
            )

    def state(self) -> dict[str, Any]:
        return {
            cls: {k: v for k, v in vars(obj).items() if not k.startswith("_")} for cls, obj in self.instances.items()
        }

    async def call(self, name: str, args: dict[str, Any]) -> types.CallToolResult:
        if name == STATE_TOOL:
            return text_result(self.state())
        target = self.methods.get(name)
        if target is None:
            return text_result(f"unknown tool {name!r}", is_error=True)
        obj, method = target
        try:
            result = getattr(obj, method)(**args)
        except Exception as exc:  # noqa: BLE001 - a backend error is the model's observation
            return text_result(f"{type(exc).__name__}: {exc}", is_error=True)
        is_error = isinstance(result, dict) and set(result) == {"error"}
        return text_result(result, is_error=is_error)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entry", help="a BFCL multi-turn entry id, e.g. multi_turn_base_0")
    parser.add_argument("--classes", help="comma-separated backend classes (without --entry)")
    parser.add_argument("--config", help="JSON file with the initial state per class (without --entry)")
    parser.add_argument("--expose-state", action="store_true", help=f"add the {STATE_TOOL} tool")
    add_transport_args(parser)
    args = parser.parse_args(argv)
    if args.entry:
        entry = load_entry(args.entry)
        backends = Backends(
            entry["involved_classes"],
            entry.get("initial_config"),
            entry.get("excluded_function"),
            long_context="long_context" in args.entry,
            expose_state=args.expose_state,
        )
    elif args.classes:
        config = json.loads(Path(args.config).read_text()) if args.config else {}
        backends = Backends(args.classes.split(","), config, expose_state=args.expose_state)
    else:
        parser.error("give --entry or --classes")
    serve(build_server("agentbatch-bfcl", backends.tools, backends.call), args.http)


if __name__ == "__main__":
    main()
