"""batches.heartbeat_at: the running process refreshes it, so a batch whose process died shows as crashed

Revision ID: 0005_batch_heartbeat
Revises: 0004_sample_group
Create Date: 2026-12-03 03:55:00
Formerly `u18_batch_heartbeat` (a branch of its own); stores stamped with that id upgrade (db/revisions.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_batch_heartbeat"
down_revision = "0004_sample_group"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("heartbeat_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        batch_op.drop_column("heartbeat_at")
