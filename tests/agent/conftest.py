"""Fixtures for the NVML / simulated-GPU tests: a fake libnvidia-ml installed under pynvml."""

from __future__ import annotations

import pynvml
import pytest

from agent.nvml.source import NvmlGpuSource
from agent.sim.gpu import SimNode
from agent.sim.install import install_simulated_nvml
from agent.sim.libnvml import SimNvmlLib


@pytest.fixture
def install():
    """install(lib) for the duration of the test; pynvml is restored afterwards."""
    before = pynvml.nvmlLib
    installed = []

    def _install(lib: SimNvmlLib) -> SimNvmlLib:
        installed.append(install_simulated_nvml(lib))
        return lib

    yield _install
    for inst in reversed(installed):
        inst.__exit__(None, None, None)
    assert pynvml.nvmlLib is before


@pytest.fixture
def h100_node() -> SimNode:
    return SimNode("h100-node", "h100", 8, workload="busy", seed=7)


@pytest.fixture
def sim(install, h100_node):
    """(lib, node): a busy 8x H100 node as the library's default node, already advanced to t=0."""
    lib = install(SimNvmlLib(h100_node))
    h100_node.advance(0.0)
    return lib, h100_node


@pytest.fixture
def source(sim):
    src = NvmlGpuSource()
    yield src
    src.close()
