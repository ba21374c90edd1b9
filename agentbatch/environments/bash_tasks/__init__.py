"""Bash-tool repository-fixing tasks run in Docker sandboxes (workload kind "bash_tasks")."""
