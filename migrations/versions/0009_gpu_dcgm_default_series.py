"""gpu_samples: the readings behind dcgm-exporter's default series (issue #16)

Nullable columns at the end of the table, in the protocol's GPU field order, where
server/store/samples.py expects them: energy counter, encoder/decoder utilization, reserved
framebuffer, row remap counts and failure, GPM graphics-engine and DRAM activity. Rows stored
before stay NULL (not read), as do rows from agents that do not send them. On PostgreSQL
gpu_samples is partitioned (0004): adding a column to the parent adds it to every partition,
and new day partitions copy the parent (LIKE).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

COLUMNS = (
    ('energy_mj_total', sa.BigInteger),
    ('util_enc_pct', sa.Float),
    ('util_dec_pct', sa.Float),
    ('mem_reserved_bytes', sa.BigInteger),
    ('remapped_rows_correctable_total', sa.BigInteger),
    ('remapped_rows_uncorrectable_total', sa.BigInteger),
    ('remapped_rows_failure', sa.Boolean),
    ('gr_engine_active_pct', sa.Float),
    ('dram_active_pct', sa.Float),
)


def upgrade() -> None:
    for name, type_ in COLUMNS:
        op.add_column('gpu_samples', sa.Column(name, type_(), nullable=True))


def downgrade() -> None:
    # Batch mode: on SQLite (which lacks DROP COLUMN before 3.35) it copies the table once for
    # all the columns, on PostgreSQL it is plain ALTER TABLE on the parent, which the partitions follow.
    with op.batch_alter_table('gpu_samples') as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
