"""Who the GPU is: UUID, product name, PCI bus id."""

from __future__ import annotations

import pynvml

from agent.nvml.session import optional
from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    gpu.uuid = str(pynvml.nvmlDeviceGetUUID(handle))
    gpu.model = optional(pynvml.nvmlDeviceGetName, handle)
    pci = optional(pynvml.nvmlDeviceGetPciInfo, handle)
    if pci is not None:
        # busId is the long (32-char) form "00000000:19:00.0"; c_char arrays come back as bytes.
        bus_id = pci.busId
        gpu.pci_bus_id = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
