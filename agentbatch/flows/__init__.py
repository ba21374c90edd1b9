"""The top: Prefect flows (run, resume, replay, deployments), the one way they are launched
(`launch.py`), the batch config schema and the `agentbatch` CLI (`flows/commands/`, one thin module
per command over the library rooms).

May import every room.
"""
