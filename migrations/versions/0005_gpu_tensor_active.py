"""gpu_samples.tensor_active_pct: tensor-pipe activity from GPM (issue #5)

A nullable column at the end of the table, where server/store/samples.py expects it (the
protocol's GPU field order). On PostgreSQL gpu_samples is partitioned (0004): adding the column
to the parent adds it to every partition, and new day partitions copy the parent (LIKE).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('gpu_samples', sa.Column('tensor_active_pct', sa.Float(), nullable=True))


def downgrade() -> None:
    # Batch mode: on SQLite (which lacks DROP COLUMN before 3.35) it copies the table, on
    # PostgreSQL it is a plain ALTER TABLE on the parent, which the partitions follow.
    with op.batch_alter_table('gpu_samples') as batch:
        batch.drop_column('tensor_active_pct')
