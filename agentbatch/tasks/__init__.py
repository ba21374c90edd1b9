"""Execution: the agent loop, one sample's chain, the inference and environment steps with retries,
the live coordinator (the asyncio driver of the scheduling core), the Prefect tasks and the custom
Prefect task runner.

Imports: scheduling, protocols, traces, db, engines, environments.
"""
