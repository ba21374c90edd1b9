"""The interfaces every room shares: chat requests/results, the Engine and Environment protocols,
and the message rendering and token counting used wherever a conversation is measured.

Imports no other agentbatch room.
"""
