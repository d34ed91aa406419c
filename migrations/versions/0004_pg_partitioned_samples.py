"""sample tables partitioned by day on PostgreSQL (issue #6)

The same columns, keys and rows; only the table kind changes (server/store/partitions.py).
SQLite keeps its plain tables: this revision does nothing there.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""
from alembic import op

from server.store import partitions

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    for table in partitions.TABLES:
        if not partitions.is_partitioned(conn, table):
            partitions.convert(conn, table, partitioned=True)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    for table in partitions.TABLES:
        if partitions.is_partitioned(conn, table):
            partitions.convert(conn, table, partitioned=False)
