"""Row remapping (Ampere+ datacenter parts): rows remapped for correctable and uncorrectable
errors, whether a remap is pending (the GPU needs a reset to retire the bad memory), and whether
one failed (no spare row left: the GPU should be replaced)."""

from __future__ import annotations

import pynvml

from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    # NotSupported as a whole on GPUs without row remapping: every field stays None.
    corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
    gpu.remapped_rows_correctable_total = int(corr)
    gpu.remapped_rows_uncorrectable_total = int(unc)
    gpu.remapped_rows_pending = bool(pending)
    gpu.remapped_rows_failure = bool(failure)
