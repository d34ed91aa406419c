"""What Laggard reads from a GPU and from an IB/RoCE port: one table, shared by the agent and
the collector (standard library only, so the agent's image carries it without the server).

A row is one reading: its name (the wire key, the sample's attribute and the storage column),
type, unit and physical range, where the agent reads it, what dcgm-exporter calls it, and what
the detector and the rollups do with it. Derived from this table:

- the agent's sample records (agent/sample.py);
- the wire format, its JSON Schema and the msgspec decoder (server/protocol.py,
  server/ingest/protocol_decoder.py);
- the sample and rollup tables (server/store/schema.py), which tests/server/test_migrations.py
  holds equal to what the migrations build, on both databases;
- the DCGM and port families of /metrics, on the agent and on the collector (agent/dcgm_fields.py);
- the detector's observations (server/detect/model.py, server/detect/observe.py).

Adding a reading: a row at the end of its table (readings are columns, in this order), the reader
that fills it, a migration that adds its column, a test.
"""

from __future__ import annotations

from typing import NamedTuple

# Physical bounds shared by many rows. Generous enough for any GPU or NIC made or announced,
# tight enough that a unit mix-up (kHz for MHz, mW for W) or garbage is refused at ingest
# instead of skewing the peer medians.
COUNT_MAX = 2**63 - 1  # counters are stored as signed 64-bit integers (PostgreSQL BIGINT)
BYTES_MAX = 2**50  # 1 PiB of GPU memory


class Series(NamedTuple):
    """The series a reading is exported as on /metrics: for a GPU, dcgm-exporter's name and help."""

    name: str
    help: str
    # gauge, or untyped: a counter whose dcgm-exporter name lacks `_total`, which `promtool
    # check metrics` rejects for a counter (rate() and increase() do not look at the type).
    type: str = "gauge"
    divisor: float | None = None  # exported as reading / divisor (dcgm-exporter's ratios of our percentages)
    extra: bool = False  # not in dcgm-exporter's default set nor on a dashboard: exported on request


class Reading(NamedTuple):
    name: str
    type: type  # int, float, bool or str
    unit: str
    lo: int | float | None  # physical range, inclusive (None: no bound)
    hi: int | float | None
    source: str  # where the agent reads it
    kind: str = "gauge"  # gauge | counter (cumulative; a decrease is a reset) | state
    series: Series | None = None
    detect: bool = False  # the detector's observation carries the reading itself
    rate: str | None = None  # ... its per-second rate under this name (readings sharing one name are summed)
    delta: str | None = None  # ... its increase since the previous sample under this name
    plot: bool = False  # rolled up per minute as min/mean/max; any other reading as its last value
    nullable: bool = True  # False: always present, `default` when absent from the wire
    default: object = None
    max_length: int | None = None  # of a str
    note: str = ""  # what a reader of the wire format should know


def _gauge(name, type_, unit, lo, hi, source, series=None, **kw) -> Reading:
    return Reading(name, type_, unit, lo, hi, source, "gauge", series, **kw)


def _counter(name, unit, source, series=None, **kw) -> Reading:
    return Reading(name, int, unit, 0, COUNT_MAX, source, "counter", series, **kw)


_MHZ = (int, "MHz", 0, 100_000)
_PCT = (float, "%", 0, 100)
_CELSIUS = (float, "C", -50, 200)
_WATTS = (float, "W", 0, 10_000)
_BYTES = (int, "bytes", 0, BYTES_MAX)

GPU_READINGS: tuple[Reading, ...] = (
    Reading("lost", bool, "", None, None, "NVML_ERROR_GPU_IS_LOST / NVML_ERROR_UNKNOWN from any call", "state", detect=True,
            nullable=False, default=False, note="the GPU fell off the bus or stopped answering: every other reading is null"),
    _gauge("temp_c", *_CELSIUS, "nvmlDeviceGetTemperatureV(NVML_TEMPERATURE_GPU)",
           Series("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."), detect=True, plot=True),
    _gauge("mem_temp_c", *_CELSIUS, "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)",
           Series("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."), plot=True),
    _gauge("power_w", *_WATTS, "nvmlDeviceGetPowerUsage (mW)", Series("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."), detect=True, plot=True),
    _gauge("power_limit_w", *_WATTS, "nvmlDeviceGetEnforcedPowerLimit (mW)",
           Series("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "Effective power limit that the driver enforces (in W)."), detect=True),
    _gauge("sm_clock_mhz", *_MHZ, "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", Series("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
           detect=True, plot=True),
    _gauge("sm_clock_max_mhz", *_MHZ, "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM), once per GPU",
           Series("DCGM_FI_DEV_MAX_SM_CLOCK", "Maximum SM clock frequency (in MHz).", extra=True), detect=True),
    _gauge("mem_clock_mhz", *_MHZ, "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)", Series("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).")),
    _gauge("mem_clock_max_mhz", *_MHZ, "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM), once per GPU"),
    _gauge("util_gpu_pct", *_PCT, "nvmlDeviceGetUtilizationRates .gpu", Series("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
           detect=True, plot=True),
    _gauge("util_mem_pct", *_PCT, "nvmlDeviceGetUtilizationRates .memory", Series("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
           plot=True),
    _gauge("mem_used_bytes", *_BYTES, "nvmlDeviceGetMemoryInfo v2: used + reserved (v1: used)", plot=True),
    _gauge("mem_total_bytes", *_BYTES, "nvmlDeviceGetMemoryInfo .total"),
    _gauge("clocks_event_reasons", int, "bitmask", 0, COUNT_MAX, "nvmlDeviceGetCurrentClocksEventReasons",
           Series("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask of NVML clocks event reasons)."), detect=True),
    _gauge("pcie_gen", int, "", 0, 16, "nvmlDeviceGetCurrPcieLinkGeneration", Series("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe current link generation."),
           detect=True),
    _gauge("pcie_gen_max", int, "", 0, 16, "nvmlDeviceGetMaxPcieLinkGeneration, once per GPU",
           Series("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "PCIe max link generation."), detect=True),
    _gauge("pcie_width", int, "lanes", 0, 64, "nvmlDeviceGetCurrPcieLinkWidth", Series("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe current link width."),
           detect=True),
    _gauge("pcie_width_max", int, "lanes", 0, 64, "nvmlDeviceGetMaxPcieLinkWidth, once per GPU",
           Series("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "PCIe max link width."), detect=True),
    _counter("pcie_replay_total", "", "nvmlDeviceGetPcieReplayCounter",
             Series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "untyped"), rate="pcie_replay_per_s"),
    _gauge("pcie_tx_bytes_per_s", float, "bytes/s", 0, 1e13, "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES) (KB/s)",
           Series("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus (in bytes per second).", extra=True), plot=True),
    _gauge("pcie_rx_bytes_per_s", float, "bytes/s", 0, 1e13, "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES) (KB/s)",
           Series("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus (in bytes per second).", extra=True), plot=True),
    _gauge("nvlink_links_up", int, "links", 0, 64, "nvmlDeviceGetNvLinkState per link", detect=True),
    _gauge("nvlink_links_total", int, "links", 0, 64, "links nvmlDeviceGetNvLinkState answers for, once per GPU", detect=True),
    _counter("nvlink_tx_bytes_total", "bytes", "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, all links) (KiB)",
             rate="nvlink_bps"),
    _counter("nvlink_rx_bytes_total", "bytes", "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, all links) (KiB)",
             rate="nvlink_bps"),
    _counter("nvlink_crc_errors_total", "", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL + _CRC_DATA_ERROR_COUNT_TOTAL",
             rate="nvlink_crc_per_s"),
    _counter("nvlink_replay_errors_total", "", "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL)",
             Series("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.", "untyped", extra=True),
             rate="nvlink_replay_per_s"),
    _counter("nvlink_recovery_errors_total", "", "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL)",
             Series("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors.", "untyped", extra=True),
             rate="nvlink_recovery_per_s"),
    _counter("ecc_corrected_total", "", "nvmlDeviceGetTotalEccErrors(CORRECTED, NVML_AGGREGATE_ECC)",
             Series("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors.", "untyped", extra=True)),
    _counter("ecc_uncorrected_total", "", "nvmlDeviceGetTotalEccErrors(UNCORRECTED, NVML_AGGREGATE_ECC)",
             Series("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.", "untyped", extra=True),
             detect=True, delta="ecc_uncorrected_new"),
    Reading("remapped_rows_pending", bool, "", None, None, "nvmlDeviceGetRemappedRows .isPending", "state",
            Series("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending.", extra=True), detect=True),
    _gauge("tensor_active_pct", *_PCT, "GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL between two sampling cycles",
           Series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipes are active.", divisor=100.0), plot=True,
           note="GPM, Hopper+; absent from older agents"),
    # dcgm-exporter's default series (issue #16); absent from older agents.
    _counter("energy_mj_total", "mJ", "nvmlDeviceGetTotalEnergyConsumption",
             Series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumed since the driver was last loaded (in mJ).", "untyped")),
    _gauge("util_enc_pct", *_PCT, "nvmlDeviceGetEncoderUtilization", Series("DCGM_FI_DEV_ENC_UTIL", "Video encoder utilization (in %).")),
    _gauge("util_dec_pct", *_PCT, "nvmlDeviceGetDecoderUtilization", Series("DCGM_FI_DEV_DEC_UTIL", "Video decoder utilization (in %).")),
    _gauge("mem_reserved_bytes", *_BYTES, "nvmlDeviceGetMemoryInfo v2 .reserved",
           Series("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved by the driver and firmware (in MiB).", divisor=1024.0 * 1024.0)),
    _counter("remapped_rows_correctable_total", "rows", "nvmlDeviceGetRemappedRows .corrRows",
             Series("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of rows remapped for correctable errors.", "untyped")),
    _counter("remapped_rows_uncorrectable_total", "rows", "nvmlDeviceGetRemappedRows .uncRows",
             Series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of rows remapped for uncorrectable errors.", "untyped")),
    Reading("remapped_rows_failure", bool, "", None, None, "nvmlDeviceGetRemappedRows .isFailureOccurred", "state",
            Series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether a row remap has failed (1: no spare row left).")),
    _gauge("gr_engine_active_pct", *_PCT, "GPM NVML_GPM_METRIC_GRAPHICS_UTIL between two sampling cycles",
           Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics/compute engine is active.", divisor=100.0), plot=True,
           note="GPM, Hopper+"),
    _gauge("dram_active_pct", *_PCT, "GPM NVML_GPM_METRIC_DRAM_BW_UTIL between two sampling cycles",
           Series("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of the device memory bandwidth in use (DRAM active).", divisor=100.0), plot=True,
           note="GPM, Hopper+"),
    # Added through this table alone (issue #14): the row, its reader (agent/nvml/readers/clocks.py), migration 0012.
    _gauge("video_clock_mhz", *_MHZ, "nvmlDeviceGetClockInfo(NVML_CLOCK_VIDEO)",
           Series("DCGM_FI_DEV_VIDEO_CLOCK", "Video encoder/decoder clock frequency (in MHz).", extra=True)),
)

NIC_READINGS: tuple[Reading, ...] = (
    Reading("state", str, "", None, None, "<port>/state (\"4: ACTIVE\" -> \"ACTIVE\")", "state", detect=True, max_length=32),
    _gauge("rate_gbps", float, "Gb/s", 0, 100_000, "<port>/rate (\"400 Gb/sec (4X NDR)\")", detect=True),
    _counter("tx_bytes_total", "bytes", "<port>/counters/port_xmit_data (4-byte words)",
             Series("laggard_nic_transmit_bytes_total", "Bytes transmitted by the IB/RoCE port.", "counter"), rate="bps"),
    _counter("rx_bytes_total", "bytes", "<port>/counters/port_rcv_data (4-byte words)",
             Series("laggard_nic_receive_bytes_total", "Bytes received by the IB/RoCE port.", "counter"), rate="bps"),
    _counter("symbol_errors_total", "", "<port>/counters/symbol_error",
             Series("laggard_nic_symbol_errors_total", "Port symbol errors.", "counter"), rate="symbol_errors_per_s"),
    _counter("link_downed_total", "", "<port>/counters/link_downed",
             Series("laggard_nic_link_downed_total", "Times the port link went down.", "counter"), delta="link_downed_new"),
    _counter("rcv_errors_total", "", "<port>/counters/port_rcv_errors",
             Series("laggard_nic_receive_errors_total", "Port receive errors.", "counter"), rate="rcv_errors_per_s"),
    _counter("xmit_discards_total", "", "<port>/counters/port_xmit_discards",
             Series("laggard_nic_transmit_discards_total", "Packets discarded by the port on transmit.", "counter")),
    _counter("xmit_wait_total", "ticks", "<port>/counters/port_xmit_wait",
             Series("laggard_nic_transmit_wait_ticks_total", "Ticks the port had data to send but no credits to send it.", "counter"),
             rate="xmit_wait_per_s"),
)

GPU_READING_NAMES: tuple[str, ...] = tuple(r.name for r in GPU_READINGS)
NIC_READING_NAMES: tuple[str, ...] = tuple(r.name for r in NIC_READINGS)
