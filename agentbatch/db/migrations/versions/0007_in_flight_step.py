"""samples.in_flight_step: the step of an environment with external state that is executing

Revision ID: 0007_in_flight_step
Revises: 0006_suite_runs
Create Date: 2026-12-03 04:20:00
Formerly `r16_in_flight_step` (a branch of its own); stores stamped with that id upgrade (db/revisions.py).

Set before such a step runs and cleared in the transaction that completes it: after a crash, a
value left there means the step may have executed (its side effects may exist) though it was
never recorded (see db/leases.py `flag_in_flight`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_in_flight_step"
down_revision = "0006_suite_runs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("in_flight_step", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_column("in_flight_step")
