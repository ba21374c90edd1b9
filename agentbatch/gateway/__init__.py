"""Gateways for external agent harnesses: an OpenAI-compatible inference gateway and an MCP tool
gateway in front of the engine workers and the tool servers, driving the same coordinator as the
built-in runner (admission, trajectory-aware routing, per-worker in-flight limits, environment slots
ordered by CAAS) and recording every request and tool call as a step in the store.

Imports every room below it (not flows or dashboards).
"""
