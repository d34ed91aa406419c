"""gpu_workloads: the workload on each GPU, stored as changes (issue #15)

One row per GPU each time what uses it changes (a pod, a Slurm job, a process; idle; unknown),
keyed by (gpu_id, ts) like the sample tables, so a re-sent batch stores nothing twice. A GPU's
row holds from its ts until the GPU's next row. The table grows with job changes, not with
samples: it is a plain table on PostgreSQL too, not partitioned by day like gpu_samples (0004).
Nothing stored before: older rows have no workload (unknown), as from agents that do not send it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-09
"""
import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('gpu_workloads',
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=True),
    sa.Column('job', sa.String(length=256), nullable=True),
    sa.Column('namespace', sa.String(length=253), nullable=True),
    sa.Column('pod', sa.String(length=253), nullable=True),
    sa.Column('pod_uid', sa.String(length=64), nullable=True),
    sa.Column('container', sa.String(length=253), nullable=True),
    sa.Column('container_id', sa.String(length=64), nullable=True),
    sa.Column('slurm_job_id', sa.String(length=64), nullable=True),
    sa.Column('slurm_step', sa.String(length=64), nullable=True),
    sa.Column('user', sa.String(length=256), nullable=True),
    sa.Column('process', sa.String(length=253), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('processes', sa.Integer(), nullable=True),
    sa.Column('workloads', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], ),
    sa.PrimaryKeyConstraint('gpu_id', 'ts')
    )


def downgrade() -> None:
    op.drop_table('gpu_workloads')
