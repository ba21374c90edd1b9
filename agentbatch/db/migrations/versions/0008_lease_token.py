"""samples.lease_token: the fencing token of a sample's lease

Revision ID: 0008_lease_token
Revises: 0007_in_flight_step
Create Date: 2026-12-03 23:40:00

Raised by one on every claim of a sample by a new owner (db/leases.py): every write for the sample
(step rows, status, score) commits only if the row still carries the token its writer claimed with
(db/writer.py), so a process that lost its lease (paused past expiry, then resumed) writes nothing.
Existing rows start at 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_lease_token"
down_revision = "0007_in_flight_step"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_token", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_column("lease_token")
