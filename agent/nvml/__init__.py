"""GPU telemetry from NVML (through pynvml): `source.NvmlGpuSource`, the `readers`, XIDs.

Nothing here knows about simulation: tests and the demo swap the C library under pynvml
(see agent.sim.install), so this code runs the same on a real node and in the simulator.
"""
