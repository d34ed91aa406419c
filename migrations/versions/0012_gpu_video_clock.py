"""gpu_samples and gpu_rollups: the video clock (DCGM_FI_DEV_VIDEO_CLOCK), the first reading
added through the field table alone (agent/fields.py, issue #14)

A nullable column at the end of each table, where the table's order puts it. Rows stored before
stay NULL, as do rows from agents that do not send it. On PostgreSQL gpu_samples is
partitioned (0004): the partitions follow the parent. The rollup keeps its last value per
minute (the table does not mark it as plotted).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

TABLES = ('gpu_samples', 'gpu_rollups')


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column('video_clock_mhz', sa.Integer(), nullable=True))


def downgrade() -> None:
    for table in reversed(TABLES):
        with op.batch_alter_table(table) as batch:
            batch.drop_column('video_clock_mhz')
