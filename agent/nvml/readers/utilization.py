"""GPU and memory-controller utilization (% of the last sample period), and the video
encoder's and decoder's."""

from __future__ import annotations

import pynvml

from agent.nvml.session import optional
from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    # One call answers both.
    util = optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
    if util is not None:
        gpu.util_gpu_pct = float(util.gpu)
        gpu.util_mem_pct = float(util.memory)
    # Each answers [percent, sampling period in µs]; the period is the driver's, not ours.
    enc = optional(pynvml.nvmlDeviceGetEncoderUtilization, handle)
    gpu.util_enc_pct = None if enc is None else float(enc[0])
    dec = optional(pynvml.nvmlDeviceGetDecoderUtilization, handle)
    gpu.util_dec_pct = None if dec is None else float(dec[0])
