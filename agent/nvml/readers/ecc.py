"""Corrected / uncorrected ECC error totals."""

from __future__ import annotations

import pynvml

from agent.nvml.session import optional
from agent.sample import GpuSample

# Aggregate, not volatile: volatile counts reset on every driver reload / GPU reset, i.e.
# exactly when a GPU that had ECC trouble gets recycled, which would hide its history and
# make the "total" go backwards. Aggregate is the lifetime count kept in the InfoROM, so it
# only ever grows and the server can take deltas safely.
_COUNTER = pynvml.NVML_AGGREGATE_ECC


def read(handle, gpu: GpuSample) -> None:
    # Both NotSupported when ECC is disabled or absent (GeForce).
    gpu.ecc_corrected_total = optional(
        pynvml.nvmlDeviceGetTotalEccErrors, handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, _COUNTER
    )
    gpu.ecc_uncorrected_total = optional(
        pynvml.nvmlDeviceGetTotalEccErrors, handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, _COUNTER
    )
