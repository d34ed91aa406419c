"""NVLink: links up / total (the total counted once per GPU), cumulative data bytes, and link
error totals."""

from __future__ import annotations

import pynvml
from pynvml import NVMLError

from agent.nvml.session import ALL_LINKS_SCOPE, UNSUPPORTED_CODES, field_values
from agent.sample import GpuSample

# A link index past the GPU's last link answers INVALID_ARGUMENT; a GPU without NVLink
# answers NOT_SUPPORTED already for link 0. Either ends the probe.
_END_OF_LINKS = UNSUPPORTED_CODES | {pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_FOUND}

# Field ids, chosen from pynvml's NVML_FI_DEV_NVLINK_* constants:
# - THROUGHPUT_DATA_TX/RX (138/139): cumulative payload KiB; scopeId UINT_MAX sums all
#   links (nvml.h). DATA rather than RAW so protocol overhead does not count as work.
# - CRC_FLIT (38) + CRC_DATA (45) _TOTAL: each CRC failure on a flow-control digit or on a
#   payload means a retransmission; summed into one "CRC errors" counter.
# - REPLAY (52) and RECOVERY (59) _TOTAL: link-level replays and link retrains.
# The _TOTAL ids are device-wide sums over links, so scopeId does not matter for them.
_TX = (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS_SCOPE)
_RX = (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS_SCOPE)
_FIELDS = [
    _TX,
    _RX,
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
]
_KIB = 1024


def count_links(handle, gpu: GpuSample) -> None:
    """nvlink_links_total: how many links the GPU has, probed link by link once per GPU;
    stays None on a GPU without NVLink."""
    total = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except NVMLError as err:
            if err.value in _END_OF_LINKS:
                break
            raise
        total += 1
    gpu.nvlink_links_total = total or None


def _sum(*parts: int | float | None) -> int | None:
    known = [int(p) for p in parts if p is not None]
    return sum(known) if known else None


def read(handle, gpu: GpuSample) -> None:
    """Uses nvlink_links_total from count_links when known."""
    if gpu.nvlink_links_total is None:
        # No NVLink, or the count failed: ask (one NOT_SUPPORTED call on a GPU without NVLink),
        # so that this reader never counts as answered without asking the GPU anything.
        count_links(handle, gpu)
    total = gpu.nvlink_links_total
    if not total:
        return  # no NVLink on this GPU: every NVLink field stays None
    state = pynvml.nvmlDeviceGetNvLinkState
    gpu.nvlink_links_up = sum(state(handle, link) == pynvml.NVML_FEATURE_ENABLED for link in range(total))
    tx, rx, crc_flit, crc_data, replay, recovery = field_values(handle, _FIELDS)
    gpu.nvlink_tx_bytes_total = None if tx is None else int(tx) * _KIB
    gpu.nvlink_rx_bytes_total = None if rx is None else int(rx) * _KIB
    gpu.nvlink_crc_errors_total = _sum(crc_flit, crc_data)
    gpu.nvlink_replay_errors_total = _sum(replay)
    gpu.nvlink_recovery_errors_total = _sum(recovery)
