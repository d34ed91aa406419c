"""hint acks: operators acknowledging the remedy of a hardware fault (issue #12)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('hint_acks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cluster', sa.String(length=253), nullable=False),
    sa.Column('node', sa.String(length=253), nullable=False),
    sa.Column('gpu', sa.Integer(), nullable=True),
    sa.Column('sample_time', sa.Float(), nullable=False),
    sa.Column('acked_at', sa.Float(), nullable=False),
    sa.Column('acked_by', sa.String(length=253), nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=True),
    sa.Column('note', sa.String(length=1000), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_hint_acks_node', 'hint_acks', ['cluster', 'node'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_hint_acks_node', table_name='hint_acks')
    op.drop_table('hint_acks')
