"""A fake libnvidia-ml.so: ctypes function pointers over simulated nodes.

pynvml's own marshalling, struct decoding and error-code -> exception mapping run unchanged on
top of it (library.py). The entry points come in families, one module each: system.py (init,
versions, finding devices), readings.py (thermals, power, clocks, utilization, memory, clock
events), fields.py (field values), links.py (PCIe, NVLink), errors.py (ECC, row remapping, XID
events), process_lists.py, gpm.py; abi.py is the ctypes plumbing, driver.py the state they share.

- A function not implemented here is absent, so pynvml raises FUNCTION_NOT_FOUND exactly as
  with an older driver; `omit=` removes implemented ones to mimic such a driver.
- A function the simulated GPU model lacks answers NVML_ERROR_NOT_SUPPORTED.
- One library serves many nodes at once: `with lib.node(sim_node): ...` (driver.py).
"""

from agent.sim.libnvml.library import SimNvmlLib

# What a driver before 535 lacks among the functions the agent uses.
PRE_535_DRIVER = frozenset({"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"})

__all__ = ["PRE_535_DRIVER", "SimNvmlLib"]
