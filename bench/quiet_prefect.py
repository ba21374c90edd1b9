"""Prefect settings for a benchmark's own temporary Prefect server: no analytics, warnings only, and a
start-up timeout long enough for a loaded 2-core machine. Set as defaults (a variable already set
wins), before Prefect is imported: `import quiet_prefect` first, from a bench in this folder."""

from __future__ import annotations

import os

SETTINGS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_LOGGING_TO_API_ENABLED": "false", "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}

for key, value in SETTINGS.items():
    os.environ.setdefault(key, value)
