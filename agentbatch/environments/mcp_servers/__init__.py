"""MCP servers the project ships (run over stdio: `python -m agentbatch.environments.mcp_servers.<name>`)."""
