"""Plugins: how a config's `kind` (a workload, an engine) or a policy's `name` becomes an object.

One function, `resolve`, is used wherever a kind is read: config load, run, resume and report
(`status` only checks that a kind's module is installed: `flows/stored_plugins.py`). A kind is one of

- a registered name: an entry point of the group `agentbatch.workloads`, `agentbatch.engines` or
  `agentbatch.policies` (agentbatch registers its built-in kinds the same way, in its own
  `pyproject.toml`; an installed package adds its own);
- `"package.module:Object"`: imported directly, no registration needed.

Every plugin declares its parameters as a pydantic model: a `Params` attribute on the object (a
class, or a function given the attribute), else one derived from the signature of the class's
`__init__` (workloads, policies). `Plugin.validate(params)` checks a config's `params` against it:
unknown keys, wrong types (`true` for an integer), non-finite numbers are refused before anything
runs; the model's defaults fill in the keys the config left out, so a default is written once.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

# The names, without pydantic, live in plugin_names (what `status` imports); re-exported here.
from agentbatch.protocols.plugin_names import GROUPS as GROUPS
from agentbatch.protocols.plugin_names import MAX_KIND_LENGTH as MAX_KIND_LENGTH
from agentbatch.protocols.plugin_names import PluginError as PluginError
from agentbatch.protocols.plugin_names import PluginKind as PluginKind
from agentbatch.protocols.plugin_names import registered as registered
from agentbatch.protocols.plugin_names import target_of


class PluginParams(BaseModel):
    """Base of a plugin's parameter model: unknown keys refused, no type coercion (`true` is not an
    integer, "3" is not a number), no infinite or NaN numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class AnyParams(BaseModel):
    """The parameters of a plugin that declares none it can be checked against (e.g. an engine
    factory `f(params, workload)` without a `Params` attribute): any mapping passes."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True, slots=True)
class Plugin:
    what: PluginKind
    kind: str  # as written in the config
    target: str  # "module:Object" it resolved to
    obj: Any  # the class or factory function

    @property
    def params_model(self) -> type[BaseModel]:
        return params_model(self.obj, self.what)

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The params, checked against the plugin's model (pydantic ValidationError if wrong), with the
        model's defaults filled in: a plugin declares each default once, in its `Params`, and its
        `__init__` (or factory) receives every field."""
        model = self.params_model.model_validate(dict(params))
        if not type(model).model_fields:
            return dict(params)
        given = model.model_dump(exclude_unset=True)  # nested values as given (their unset keys left out)
        return {**{k: v for k, v in model.model_dump().items() if k not in given}, **given}


def resolve(what: PluginKind, kind: str, builtins: Mapping[str, str] | None = None) -> Plugin:
    """The plugin a `kind` names. `builtins`: names known without installed metadata (agentbatch's
    own, for a source tree that was never `pip install`ed); entry points of the same name win."""
    target = target_of(what, kind, builtins)
    return Plugin(what, kind, target, load_target(target))


def load_target(target: str) -> Any:
    """Import "package.module:Object" (Object may be dotted: "module:Class.factory")."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise PluginError(f"{target!r}: expected 'package.module:Object'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"{target!r}: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{target!r}: module {module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise PluginError(f"{target!r} is a {type(obj).__name__}, not a class or function")
    return obj


@cache
def params_model(obj: Any, what: str = "workload") -> type[BaseModel]:
    """The plugin's declared `Params` model, else one built from its signature."""
    declared = getattr(obj, "Params", None)
    if isinstance(declared, type) and issubclass(declared, BaseModel):
        return declared
    if what == "engine":  # a factory f(params, workload): nothing to derive from
        return AnyParams
    return _signature_model(obj)


def _signature_model(obj: Callable[..., Any]) -> type[BaseModel]:
    func = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(func)
        hints = typing.get_type_hints(func)
    except (TypeError, ValueError, NameError):
        return AnyParams
    fields: dict[str, Any] = {}
    extra: Literal["forbid", "allow"] = "forbid"
    for i, (name, p) in enumerate(sig.parameters.items()):
        if i == 0 and inspect.isclass(obj) and name == "self":
            continue
        if p.kind is p.VAR_KEYWORD:
            extra = "allow"
            continue
        if p.kind is p.VAR_POSITIONAL or name.startswith("_"):
            continue
        default = ... if p.default is p.empty else p.default
        fields[name] = (hints.get(name, Any), default)
    config = ConfigDict(extra=extra, strict=True, allow_inf_nan=False, arbitrary_types_allowed=True)
    return create_model(f"{getattr(obj, '__name__', 'Plugin')}Params", __config__=config, **fields)
