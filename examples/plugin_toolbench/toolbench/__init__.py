"""toolbench: an example agentbatch plugin (workload, engine, policy). See docs/plugins.md."""
