"""inspect_ai through the agentbatch gateway.

- the model provider `agentbatch/<model>`: inspect's OpenAI-compatible client pointed at the
  gateway's `/v1`, every request naming its sample (`X-Agentbatch-Sample`: task, sample id, epoch);
- a hook that finishes each sample on the gateway when inspect finishes it, with its score;
- `gateway_mcp_server()`: the gateway's MCP tool gateway as an inspect MCP server, its tool calls
  named by the same sample.
"""

from inspect_agentbatch.identity import SAMPLE_HEADER, current_sample_key, gateway_root
from inspect_agentbatch.tools import gateway_mcp_server

__all__ = ["SAMPLE_HEADER", "current_sample_key", "gateway_mcp_server", "gateway_root"]
