"""samples.in_flight_step: the step of an environment with external state that is executing

Revision ID: r16_in_flight_step
Revises: 0003_sample_leases
Create Date: 2026-12-03 04:20:00

Set before such a step runs and cleared in the transaction that completes it: after a crash, a
value left there means the step may have executed (its side effects may exist) though it was
never recorded (see db/leases.py `flag_in_flight`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r16_in_flight_step"
down_revision = "0003_sample_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("in_flight_step", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_column("in_flight_step")
