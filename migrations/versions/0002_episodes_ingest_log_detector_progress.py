"""episodes, ingest log, detector progress

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('detector_progress',
    sa.Column('key', sa.String(length=300), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('episodes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cluster', sa.String(length=253), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('gpu', sa.Integer(), nullable=True),
    sa.Column('uuid', sa.String(length=253), nullable=True),
    sa.Column('entity', sa.String(length=600), nullable=False),
    sa.Column('cause', sa.String(length=32), nullable=False),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('onset', sa.Float(), nullable=False),
    sa.Column('detected_at', sa.Float(), nullable=False),
    sa.Column('resolved_at', sa.Float(), nullable=True),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.Column('summary', sa.String(length=1000), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('episodes', schema=None) as batch_op:
        batch_op.create_index('ix_episodes_active', ['resolved_at', 'cluster'], unique=False)
        batch_op.create_index('ix_episodes_onset', ['onset'], unique=False)

    op.create_table('ingest_log',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('min_ts', sa.Float(), nullable=False),
    sa.Column('max_ts', sa.Float(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('committed_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table('ingest_log')
    with op.batch_alter_table('episodes', schema=None) as batch_op:
        batch_op.drop_index('ix_episodes_onset')
        batch_op.drop_index('ix_episodes_active')

    op.drop_table('episodes')
    op.drop_table('detector_progress')
