"""batches.heartbeat_at: the running process refreshes it, so a batch whose process died shows as crashed

Revision ID: u18_batch_heartbeat
Revises: 0002_vllm_metrics
Create Date: 2026-12-03 03:55:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "u18_batch_heartbeat"
down_revision = "0002_vllm_metrics"
branch_labels = ("heartbeat",)
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("heartbeat_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        batch_op.drop_column("heartbeat_at")
