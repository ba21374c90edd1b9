"""Imported by inspect_ai through the `inspect_ai` entry point: registers the provider and the hooks."""

from inspect_agentbatch.hooks import AgentbatchHooks
from inspect_agentbatch.provider import AgentbatchAPI

__all__ = ["AgentbatchAPI", "AgentbatchHooks"]
