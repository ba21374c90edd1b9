"""The SQL store: SQLAlchemy 2 models, the store API (batched writer, sample leases, history),
Alembic migrations, and trace import/export (`trace_io`). SQLite by default, PostgreSQL by URL.

Imports: scheduling, traces, protocols.
"""
