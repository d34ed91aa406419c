"""The clocks event (formerly "throttle") reason bitmask: why the clocks are below max."""

from __future__ import annotations

import pynvml
from pynvml import NVMLError

from agent.nvml.session import optional
from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    # The "Event" name exists from driver 535; older drivers only have the "Throttle" one
    # (same bits). The Throttle one is deprecated and will disappear, so try Event first.
    try:
        gpu.clocks_event_reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        return
    except NVMLError as err:
        if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    gpu.clocks_event_reasons = optional(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
