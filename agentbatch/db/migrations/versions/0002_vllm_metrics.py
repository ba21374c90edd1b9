"""worker_metrics: time series of scraped engine metrics (vLLM /metrics)

Revision ID: 0002_vllm_metrics
Revises: 0001_initial
Create Date: 2026-12-02 15:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_vllm_metrics"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("prefix_cache_queries", sa.Float(), nullable=False),
        sa.Column("prefix_cache_hits", sa.Float(), nullable=False),
        sa.Column("kv_cache_usage", sa.Float(), nullable=True),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("waiting", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.Float(), nullable=False),
        sa.Column("generation_tokens", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_worker_metrics_batch_worker_t", "worker_metrics", ["batch_id", "worker", "t"])


def downgrade() -> None:
    op.drop_index("ix_worker_metrics_batch_worker_t", table_name="worker_metrics")
    op.drop_table("worker_metrics")
