"""MCP servers the project ships (run over stdio: `python -m agentbatch.tasks.environments.mcp_servers.<name>`)."""
