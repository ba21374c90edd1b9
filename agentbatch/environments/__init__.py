"""Environments (the tool side of a sample): BFCL multi-turn backends, Docker sandboxes, MCP servers,
recorded environments for replay, capacity limiters; `registry` picks a workload by the config's
`workload.kind` (plugins by entry point).

Imports: protocols, traces, db.
"""
