"""initial schema: nodes, GPUs, NICs, their time series, XID events

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('nodes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cluster', sa.String(length=253), nullable=False),
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('agent', sa.JSON(), nullable=True),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.Column('last_seen', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('cluster', 'name', name='uq_nodes_cluster_name')
    )
    op.create_table('gpus',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=253), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=True),
    sa.Column('pci_bus_id', sa.String(length=64), nullable=True),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('uuid')
    )
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gpus_node_id'), ['node_id'], unique=False)

    op.create_table('nics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('device', sa.String(length=253), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('node_id', 'device', 'port', name='uq_nics_node_device_port')
    )
    op.create_table('gpu_samples',
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('lost', sa.Boolean(), nullable=False),
    sa.Column('temp_c', sa.Float(), nullable=True),
    sa.Column('mem_temp_c', sa.Float(), nullable=True),
    sa.Column('power_w', sa.Float(), nullable=True),
    sa.Column('power_limit_w', sa.Float(), nullable=True),
    sa.Column('sm_clock_mhz', sa.Integer(), nullable=True),
    sa.Column('sm_clock_max_mhz', sa.Integer(), nullable=True),
    sa.Column('mem_clock_mhz', sa.Integer(), nullable=True),
    sa.Column('mem_clock_max_mhz', sa.Integer(), nullable=True),
    sa.Column('util_gpu_pct', sa.Float(), nullable=True),
    sa.Column('util_mem_pct', sa.Float(), nullable=True),
    sa.Column('mem_used_bytes', sa.BigInteger(), nullable=True),
    sa.Column('mem_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('clocks_event_reasons', sa.BigInteger(), nullable=True),
    sa.Column('pcie_gen', sa.Integer(), nullable=True),
    sa.Column('pcie_gen_max', sa.Integer(), nullable=True),
    sa.Column('pcie_width', sa.Integer(), nullable=True),
    sa.Column('pcie_width_max', sa.Integer(), nullable=True),
    sa.Column('pcie_replay_total', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_s', sa.Float(), nullable=True),
    sa.Column('pcie_rx_bytes_per_s', sa.Float(), nullable=True),
    sa.Column('nvlink_links_up', sa.Integer(), nullable=True),
    sa.Column('nvlink_links_total', sa.Integer(), nullable=True),
    sa.Column('nvlink_tx_bytes_total', sa.BigInteger(), nullable=True),
    sa.Column('nvlink_rx_bytes_total', sa.BigInteger(), nullable=True),
    sa.Column('nvlink_crc_errors_total', sa.BigInteger(), nullable=True),
    sa.Column('nvlink_replay_errors_total', sa.BigInteger(), nullable=True),
    sa.Column('nvlink_recovery_errors_total', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_total', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_total', sa.BigInteger(), nullable=True),
    sa.Column('remapped_rows_pending', sa.Boolean(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], ),
    sa.PrimaryKeyConstraint('gpu_id', 'ts'),
    )
    op.create_table('nic_samples',
    sa.Column('nic_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=True),
    sa.Column('rate_gbps', sa.Float(), nullable=True),
    sa.Column('tx_bytes_total', sa.BigInteger(), nullable=True),
    sa.Column('rx_bytes_total', sa.BigInteger(), nullable=True),
    sa.Column('symbol_errors_total', sa.BigInteger(), nullable=True),
    sa.Column('link_downed_total', sa.BigInteger(), nullable=True),
    sa.Column('rcv_errors_total', sa.BigInteger(), nullable=True),
    sa.Column('xmit_discards_total', sa.BigInteger(), nullable=True),
    sa.Column('xmit_wait_total', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['nic_id'], ['nics.id'], ),
    sa.PrimaryKeyConstraint('nic_id', 'ts'),
    )
    op.create_table('xid_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('xid', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('gpu_id', 'ts', 'xid', name='uq_xid_events_gpu_ts_xid')
    )
    with op.batch_alter_table('xid_events', schema=None) as batch_op:
        batch_op.create_index('ix_xid_events_ts', ['ts'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('xid_events', schema=None) as batch_op:
        batch_op.drop_index('ix_xid_events_ts')

    op.drop_table('xid_events')
    op.drop_table('nic_samples')
    op.drop_table('gpu_samples')
    op.drop_table('nics')
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gpus_node_id'))

    op.drop_table('gpus')
    op.drop_table('nodes')
