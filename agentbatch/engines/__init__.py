"""Engine clients and engine processes: the OpenAI-compatible client (vLLM or any server), the
scripted and replay engines, timing models (the simulated engine in real time: `sim_timing`), the
`serve-sim` HTTP server, the vLLM worker launcher and the `/metrics` scraper; `registry` picks an
engine by the config's `engine.kind`.

Imports: scheduling, protocols, traces, sim, db, environments.
"""
