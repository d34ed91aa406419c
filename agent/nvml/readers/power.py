"""Board power draw, the enforced power limit (NVML gives milliwatts) and the energy counter."""

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
    # Millijoules since the driver was last loaded (Volta and newer): a counter, so its rate is
    # the average power over any window, which the instantaneous power_w samples only estimate.
    energy_mj = optional(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)
    gpu.energy_mj_total = None if energy_mj is None else int(energy_mj)
