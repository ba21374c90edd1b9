"""agentbatch: run big batches of LLM-agent samples so that the whole batch finishes sooner.

The package is laid out in rooms whose imports point down (docs/architecture.md has the map):
scheduling, protocols -> traces -> planning, db -> sim, environments -> engines -> tasks -> gateway,
dashboards -> flows. `python -m agentbatch.devtools.check_layout` checks the rules.
"""

__all__ = ["ConfigError", "aresume", "arun", "resume", "run"]


def __getattr__(name: str):  # noqa: ANN202 - lazy: `import agentbatch` stays cheap (no Prefect, no pandas)
    """The Python API (agentbatch/api.py), imported on first use: `agentbatch.run(...)`."""
    if name in __all__:
        from agentbatch import api

        return getattr(api, name)
    raise AttributeError(f"module 'agentbatch' has no attribute {name!r}")
