"""episode events: the detector's episode changes, read by the outputs (issue #14)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('episode_events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('episode_id', sa.Integer(), nullable=False),
    sa.Column('change', sa.String(length=16), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('episode', sa.JSON(), nullable=False),
    sa.Column('alerted', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sqlite_autoincrement=True
    )
    op.create_index('ix_episode_events_alerted', 'episode_events', ['alerted'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_episode_events_alerted', table_name='episode_events')
    op.drop_table('episode_events')
