"""Simulated hardware for tests and the demo.

GPUs: `gpu.SimNode` (N `SimGpu`s of a `models` entry, time-driven, with `faults`) behind
`libnvml.SimNvmlLib`, a fake libnvidia-ml that `install.install_simulated_nvml` puts under
pynvml. InfiniBand: `infiniband` (a simulated sysfs tree).
"""
