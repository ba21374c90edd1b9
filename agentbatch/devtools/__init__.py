"""Developer tools: the layout and complexity checker (`python -m agentbatch.devtools.check_layout`).

Imports no other agentbatch room.
"""
