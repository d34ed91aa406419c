"""api tokens (issue #7)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('scopes', sa.String(length=100), nullable=False),
    sa.Column('cluster', sa.String(length=253), nullable=True),
    sa.Column('nodes', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('revoked_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_id')
    )


def downgrade() -> None:
    op.drop_table('api_tokens')
