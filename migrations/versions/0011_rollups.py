"""gpu_rollups, nic_rollups, rollup_progress: per-minute rollups (issue #17)

Raw samples are kept for a short time (48 h by default); each minute of each GPU and port is
rolled up (server/store/rollups.py) and kept 30 days: the gauges a dashboard plots as
min/mean/max in single precision, every other reading as its last value in the minute.
Plain tables on PostgreSQL too (a row per minute, not per sample). Nothing is rolled up at
upgrade: the collector rolls up what raw samples are still stored, oldest first.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('gpu_rollups',
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('minute', sa.Integer(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('lost', sa.Boolean(), nullable=True),
    sa.Column('temp_c_min', sa.REAL(), nullable=True),
    sa.Column('temp_c_mean', sa.REAL(), nullable=True),
    sa.Column('temp_c_max', sa.REAL(), nullable=True),
    sa.Column('mem_temp_c_min', sa.REAL(), nullable=True),
    sa.Column('mem_temp_c_mean', sa.REAL(), nullable=True),
    sa.Column('mem_temp_c_max', sa.REAL(), nullable=True),
    sa.Column('power_w_min', sa.REAL(), nullable=True),
    sa.Column('power_w_mean', sa.REAL(), nullable=True),
    sa.Column('power_w_max', sa.REAL(), nullable=True),
    sa.Column('power_limit_w', sa.Float(), nullable=True),
    sa.Column('sm_clock_mhz_min', sa.REAL(), nullable=True),
    sa.Column('sm_clock_mhz_mean', sa.REAL(), nullable=True),
    sa.Column('sm_clock_mhz_max', sa.REAL(), nullable=True),
    sa.Column('sm_clock_max_mhz', sa.Integer(), nullable=True),
    sa.Column('mem_clock_mhz', sa.Integer(), nullable=True),
    sa.Column('mem_clock_max_mhz', sa.Integer(), nullable=True),
    sa.Column('util_gpu_pct_min', sa.REAL(), nullable=True),
    sa.Column('util_gpu_pct_mean', sa.REAL(), nullable=True),
    sa.Column('util_gpu_pct_max', sa.REAL(), nullable=True),
    sa.Column('util_mem_pct_min', sa.REAL(), nullable=True),
    sa.Column('util_mem_pct_mean', sa.REAL(), nullable=True),
    sa.Column('util_mem_pct_max', sa.REAL(), nullable=True),
    sa.Column('mem_used_bytes_min', sa.REAL(), nullable=True),
    sa.Column('mem_used_bytes_mean', sa.REAL(), nullable=True),
    sa.Column('mem_used_bytes_max', sa.REAL(), nullable=True),
    sa.Column('mem_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('clocks_event_reasons', sa.BigInteger(), nullable=True),
    sa.Column('pcie_gen', sa.Integer(), nullable=True),
    sa.Column('pcie_gen_max', sa.Integer(), nullable=True),
    sa.Column('pcie_width', sa.Integer(), nullable=True),
    sa.Column('pcie_width_max', sa.Integer(), nullable=True),
    sa.Column('pcie_replay_total', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_s_min', sa.REAL(), nullable=True),
    sa.Column('pcie_tx_bytes_per_s_mean', sa.REAL(), nullable=True),
    sa.Column('pcie_tx_bytes_per_s_max', sa.REAL(), nullable=True),
    sa.Column('pcie_rx_bytes_per_s_min', sa.REAL(), nullable=True),
    sa.Column('pcie_rx_bytes_per_s_mean', sa.REAL(), nullable=True),
    sa.Column('pcie_rx_bytes_per_s_max', sa.REAL(), nullable=True),
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
    sa.Column('tensor_active_pct_min', sa.REAL(), nullable=True),
    sa.Column('tensor_active_pct_mean', sa.REAL(), nullable=True),
    sa.Column('tensor_active_pct_max', sa.REAL(), nullable=True),
    sa.Column('energy_mj_total', sa.BigInteger(), nullable=True),
    sa.Column('util_enc_pct', sa.Float(), nullable=True),
    sa.Column('util_dec_pct', sa.Float(), nullable=True),
    sa.Column('mem_reserved_bytes', sa.BigInteger(), nullable=True),
    sa.Column('remapped_rows_correctable_total', sa.BigInteger(), nullable=True),
    sa.Column('remapped_rows_uncorrectable_total', sa.BigInteger(), nullable=True),
    sa.Column('remapped_rows_failure', sa.Boolean(), nullable=True),
    sa.Column('gr_engine_active_pct_min', sa.REAL(), nullable=True),
    sa.Column('gr_engine_active_pct_mean', sa.REAL(), nullable=True),
    sa.Column('gr_engine_active_pct_max', sa.REAL(), nullable=True),
    sa.Column('dram_active_pct_min', sa.REAL(), nullable=True),
    sa.Column('dram_active_pct_mean', sa.REAL(), nullable=True),
    sa.Column('dram_active_pct_max', sa.REAL(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], ),
    sa.PrimaryKeyConstraint('gpu_id', 'minute')
    )
    op.create_table('nic_rollups',
    sa.Column('nic_id', sa.Integer(), nullable=False),
    sa.Column('minute', sa.Integer(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
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
    sa.PrimaryKeyConstraint('nic_id', 'minute')
    )
    op.create_table('rollup_progress',
    sa.Column('samples_table', sa.String(length=64), nullable=False),
    sa.Column('through_minute', sa.Integer(), nullable=False),
    sa.Column('log_id', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('samples_table')
    )


def downgrade() -> None:
    op.drop_table('rollup_progress')
    op.drop_table('nic_rollups')
    op.drop_table('gpu_rollups')
