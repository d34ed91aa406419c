"""Row remapping (Ampere+): a pending remap means the GPU needs a reset to retire bad memory."""

from __future__ import annotations

import pynvml

from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    _corr, _unc, pending, _failure = pynvml.nvmlDeviceGetRemappedRows(handle)
    gpu.remapped_rows_pending = bool(pending)
