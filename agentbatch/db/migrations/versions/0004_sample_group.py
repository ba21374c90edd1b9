"""samples.task_group: the task's suite or category, for scores by group

Revision ID: 0004_sample_group
Revises: 0003_sample_leases
Create Date: 2026-12-03 03:55:00

A workload's `TaskSpec.group` (e.g. BFCL's category, a benchmark's suite) is kept with each sample
so that `status`, the report and comparisons break the score down by it. NULL: no group.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_sample_group"
down_revision = "0003_sample_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("task_group", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("task_group")
