"""The `agentbatch` CLI commands, one module per command (auto-discovered by `flows/cli.py`; modules
starting with `_` are shared helpers). Each maps its arguments onto library functions: bad input
gives a message naming the file, field or argument, and exit code 2.
"""
