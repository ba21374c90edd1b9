"""suite_runs: the suite of each batch, what started it (deployment, tag) and the priors it used

Revision ID: 0006_suite_runs
Revises: 0005_batch_heartbeat
Create Date: 2026-12-03 04:00:00
Formerly `h01_suite_runs` (a branch of its own); stores stamped with that id upgrade (db/revisions.py).

One row per batch (agentbatch/db/history.py). Rows of batches written before this table existed are
filled in on first use, from each batch's config and task ids.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_suite_runs"
down_revision = "0005_batch_heartbeat"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "suite_runs",
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("suite_key", sa.String(length=32), nullable=False),
        sa.Column("workload_kind", sa.String(length=200), nullable=False),
        sa.Column("tasks", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(length=200), nullable=True),
        sa.Column("deployment", sa.String(length=200), nullable=True),
        sa.Column("deployment_id", sa.String(length=64), nullable=True),
        sa.Column("priors_source", sa.String(length=20), nullable=True),
        sa.Column("priors_runs", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("priors_tasks", sa.Integer(), nullable=False, server_default="0"),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    op.create_index("ix_suite_runs_suite_key", "suite_runs", ["suite_key"])


def downgrade() -> None:
    op.drop_index("ix_suite_runs_suite_key", table_name="suite_runs")
    op.drop_table("suite_runs")
