"""Board power draw and the enforced power limit (NVML gives milliwatts)."""

from __future__ import annotations

import pynvml

from agent.nvml.session import optional
from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    usage_mw = optional(pynvml.nvmlDeviceGetPowerUsage, handle)
    gpu.power_w = None if usage_mw is None else usage_mw / 1000.0
    # Enforced = the limit actually applied (min of user, default and board limits); a GPU
    # capped lower than its peers is a classic straggler cause.
    limit_mw = optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    gpu.power_limit_w = None if limit_mw is None else limit_mw / 1000.0
