"""A simulated fleet in one process: many nodes behind one simulated libnvidia-ml.

pynvml holds one NVML library per process, so the fleet installs one SimNvmlLib and every
node's reads run inside `lib.node(...)`, which routes the node-scoped NVML calls (device
count, handle by index, events) to that node. Each node also gets its own simulated IB
sysfs tree. The real pynvml bindings and the real readers run for every node.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from agent.nvml.source import NvmlGpuSource
from agent.sample import GpuSample, NicSample
from agent.sim.gpu import SimNode
from agent.sim.infiniband import SimIbTree, is_ib_fault
from agent.sim.install import install_simulated_nvml, uninstall_simulated_nvml
from agent.sim.libnvml import SimNvmlLib
from agent.sysfs.infiniband import read_ib_ports


class SimulatedNode:
    """One node's GPU source (NvmlGpuSource over the simulated library) and IB ports."""

    def __init__(self, lib: SimNvmlLib, sim: SimNode, ib: SimIbTree):
        self.lib = lib
        self.sim = sim
        self.ib = ib
        with lib.node(sim):
            self.source = NvmlGpuSource()

    @property
    def name(self) -> str:
        return self.sim.name

    def read(self, ts: float) -> list[GpuSample]:
        with self.lib.node(self.sim, at=ts):
            return self.source.read(ts)

    def read_nics(self, ts: float) -> list[NicSample]:
        self.ib.advance(ts)
        return read_ib_ports(self.ib.root)

    def driver_version(self) -> str | None:
        with self.lib.node(self.sim):
            return self.source.driver_version()

    def cuda_version(self) -> str | None:
        with self.lib.node(self.sim):
            return self.source.cuda_version()

    def inject(self, spec: str) -> None:
        """A fault by spec: "gpu3:thermal", "5:xid=79", "ib2:down" ..."""
        if is_ib_fault(spec):
            self.ib.inject(spec)
        else:
            self.sim.apply(spec)

    def close(self) -> None:
        with self.lib.node(self.sim):
            self.source.close()
        shutil.rmtree(self.ib.root, ignore_errors=True)


class SimFleet:
    def __init__(self) -> None:
        self.lib = SimNvmlLib()
        install_simulated_nvml(self.lib)
        self.nodes: list[SimulatedNode] = []

    def add_node(
        self, name: str, *, model: str = "h100", gpus: int = 8, nics: int = 8, faults: list[str] = (), workload: str = "busy", seed: int = 0
    ) -> SimulatedNode:
        # tmpfs when there is one: the IB simulator rewrites its counter files every sample.
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        ib = SimIbTree(tempfile.mkdtemp(prefix=f"laggard-sim-ib-{name}-", dir=shm), devices=nics, seed=f"{name}/{seed}")
        try:
            sim = SimNode(name=name, model=model, gpus=gpus, workload=workload, seed=seed)
            node = SimulatedNode(self.lib, sim, ib)
            for spec in faults:
                node.inject(spec)
        except BaseException:
            shutil.rmtree(ib.root, ignore_errors=True)
            raise
        self.nodes.append(node)
        return node

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.nodes.clear()
        uninstall_simulated_nvml()
