"""PCIe link generation/width (current, and the maximum read once per GPU), replay counter
and TX/RX throughput."""

from __future__ import annotations

import pynvml

from agent.nvml.session import optional
from agent.sample import GpuSample

# nvmlDeviceGetPcieThroughput answers KB/s (NVML's KB is 1024 bytes, as in its other units).
_KB = 1024


def read(handle, gpu: GpuSample) -> None:
    gpu.pcie_gen = optional(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
    gpu.pcie_width = optional(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle)
    gpu.pcie_replay_total = optional(pynvml.nvmlDeviceGetPcieReplayCounter, handle)
    tx = optional(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
    rx = optional(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    gpu.pcie_tx_bytes_per_s = None if tx is None else float(tx * _KB)
    gpu.pcie_rx_bytes_per_s = None if rx is None else float(rx * _KB)


def read_max(handle, gpu: GpuSample) -> None:
    # What the GPU and its slot can do (a downtrained link shows in the current values).
    gpu.pcie_gen_max = optional(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
    gpu.pcie_width_max = optional(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
