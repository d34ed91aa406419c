"""alert outbox and deliveries, metric counters (issue #5)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('alert_outbox',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('episode_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('cluster', sa.String(length=253), nullable=False),
    sa.Column('cause', sa.String(length=32), nullable=False),
    sa.Column('fingerprint', sa.String(length=32), nullable=False),
    sa.Column('alert', sa.JSON(), nullable=False),
    sa.Column('routed', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sqlite_autoincrement=True,
    )
    with op.batch_alter_table('alert_outbox', schema=None) as batch_op:
        batch_op.create_index('ix_alert_outbox_episode', ['episode_id'], unique=False)
        batch_op.create_index('ix_alert_outbox_routed', ['routed'], unique=False)

    op.create_table('alert_deliveries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('outbox_id', sa.Integer(), nullable=False),
    sa.Column('receiver', sa.String(length=253), nullable=False),
    sa.Column('group_key', sa.String(length=600), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('next_attempt_at', sa.Float(), nullable=False),
    sa.Column('lease_until', sa.Float(), nullable=True),
    sa.Column('lease_token', sa.String(length=64), nullable=True),
    sa.Column('last_error', sa.String(length=500), nullable=True),
    sa.Column('done_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['outbox_id'], ['alert_outbox.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('outbox_id', 'receiver', name='uq_alert_deliveries_outbox_receiver')
    )
    with op.batch_alter_table('alert_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_alert_deliveries_state', ['state', 'receiver', 'group_key'], unique=False)

    op.create_table('metric_counters',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('labels', sa.String(length=1000), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name', 'labels')
    )


def downgrade() -> None:
    op.drop_table('metric_counters')
    with op.batch_alter_table('alert_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_alert_deliveries_state')

    op.drop_table('alert_deliveries')
    with op.batch_alter_table('alert_outbox', schema=None) as batch_op:
        batch_op.drop_index('ix_alert_outbox_routed')
        batch_op.drop_index('ix_alert_outbox_episode')

    op.drop_table('alert_outbox')
