"""sample leases, retry counts, longer batch statuses, one completed attempt per step

Revision ID: 0003_sample_leases
Revises: 0002_vllm_metrics
Create Date: 2026-12-03 03:40:00

- `samples.lease_owner` / `lease_expires_at`: the process that drives a sample (see db/leases.py).
- `samples.retries`: how often `agentbatch retry` reset the sample after it failed.
- `batches.status` grows to 32 characters (`completed_with_failures`).
- A partial unique index allows one `completed` attempt per (sample, step index): a second process
  can never record the same step as completed twice. Duplicates written before it existed are
  demoted to `abandoned` first (the earliest completion stays).

On SQLite the `batches` change rebuilds the table (batch mode: copy, drop, rename), which the
migration runner does with foreign keys off (db/engine.py `migrate`): with them on, dropping the old
table deleted every sample and step of the store.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_sample_leases"
down_revision = "0002_vllm_metrics"
branch_labels = None
depends_on = None

_DEMOTE_DUPLICATES = """
UPDATE steps SET status = 'abandoned', error = 'duplicate completion (recorded before leases)'
WHERE status = 'completed' AND id NOT IN (
    SELECT min_id FROM (SELECT min(id) AS min_id FROM steps WHERE status = 'completed'
                        GROUP BY sample_id, "index") AS firsts)
"""


def upgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_owner", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("lease_expires_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.alter_column("status", existing_type=sa.String(length=20), type_=sa.String(length=32),
                              existing_nullable=False)
    op.execute(_DEMOTE_DUPLICATES)
    op.create_index("ux_steps_one_completion", "steps", ["sample_id", "index"], unique=True,
                    sqlite_where=sa.text("status = 'completed'"),
                    postgresql_where=sa.text("status = 'completed'"))


def downgrade() -> None:
    op.drop_index("ux_steps_one_completion", table_name="steps")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.alter_column("status", existing_type=sa.String(length=32), type_=sa.String(length=20),
                              existing_nullable=False)
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_column("retries")
        batch_op.drop_column("lease_expires_at")
        batch_op.drop_column("lease_owner")
