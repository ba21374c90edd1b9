"""agentbatch: run big batches of LLM-agent samples so that the whole batch finishes sooner.

The package is laid out in rooms whose imports point down (docs/architecture.md has the map):
scheduling, protocols -> traces -> planning, db -> sim, environments -> engines -> tasks -> gateway,
dashboards -> flows. `python -m agentbatch.devtools.check_layout` checks the rules.
"""
