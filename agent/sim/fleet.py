"""A simulated fleet in one process: many nodes behind one simulated libnvidia-ml.

pynvml holds one NVML library per process, so the fleet installs one SimNvmlLib and every
node's reads run inside `lib.node(...)`, which routes the node-scoped NVML calls (device
count, handle by index, events) to that node. Each node also gets its own simulated IB
sysfs tree. The real pynvml bindings and the real readers run for every node.

With `attribution=True` a node also keeps a simulated /proc tree of the processes its GPUs run
(SimNode.run_slurm_job / run_pod) and attributes them with the real agent.workload code, as
the agent does on a real node.
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
from agent.sim.proctree import ProcTree
from agent.sysfs.infiniband import IbPorts, read_ib_ports


class SimulatedNode:
    """One node's GPU source (NvmlGpuSource over the simulated library) and IB ports.

    `keep_files_open`: read the IB tree as the agent does on a real node (IbPorts), and write
    it through descriptors kept open: ~200 open files per node, so off for a fleet in one
    process, where that many per node adds up."""

    def __init__(self, lib: SimNvmlLib, sim: SimNode, ib: SimIbTree, *, keep_files_open: bool = False):
        self.lib = lib
        self.sim = sim
        self.ib = ib
        self._ports = IbPorts(ib.root) if keep_files_open else None
        self.proc: ProcTree | None = None
        with lib.node(sim):
            self.source = NvmlGpuSource()

    def enable_attribution(self, proc_root: str, *, pods_url: str | None = None) -> None:
        """Attribute each GPU's processes (agent.workload) through a simulated /proc tree at
        `proc_root`, kept in step with the processes at every read; Kubernetes pods are named
        from `pods_url` (a PodList), Slurm jobs from their processes' environ."""
        from agent.workload import open_attribution

        self.proc = ProcTree(proc_root)
        self.proc.sync(self.sim.processes)
        self.source.attribution = open_attribution(proc_root=proc_root, node=self.name, kubernetes="auto" if pods_url else "off",
                                                   pods_url=pods_url, env={})

    @property
    def attribution(self):
        return self.source.attribution

    @property
    def name(self) -> str:
        return self.sim.name

    def read(self, ts: float) -> list[GpuSample]:
        if self.proc is not None:
            self.proc.sync(self.sim.processes)
        with self.lib.node(self.sim, at=ts):
            return self.source.read(ts)

    def read_nics(self, ts: float) -> list[NicSample]:
        self.ib.advance(ts)
        return self._ports.read() if self._ports is not None else read_ib_ports(self.ib.root)

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
        if self._ports is not None:
            self._ports.close()
        self.ib.close()
        shutil.rmtree(self.ib.root, ignore_errors=True)
        if self.proc is not None:
            self.proc.remove()


class SimFleet:
    def __init__(self) -> None:
        self.lib = SimNvmlLib()
        install_simulated_nvml(self.lib)
        self.nodes: list[SimulatedNode] = []

    def add_node(
        self, name: str, *, model: str = "h100", gpus: int = 8, nics: int = 8, faults: list[str] = (), workload: str = "busy", seed: int = 0,
        keep_files_open: bool = False, attribution: bool = False, pods_url: str | None = None,
    ) -> SimulatedNode:
        """attribution: attribute the processes the node's GPUs run (node.sim.run_slurm_job ...)
        through a simulated /proc tree in a temporary directory (see SimulatedNode.enable_attribution)."""
        # tmpfs when there is one: the IB simulator rewrites its counter files every sample.
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        ib = SimIbTree(tempfile.mkdtemp(prefix=f"laggard-sim-ib-{name}-", dir=shm), devices=nics, seed=f"{name}/{seed}",
                       keep_open=keep_files_open)
        try:
            sim = SimNode(name=name, model=model, gpus=gpus, workload=workload, seed=seed)
            node = SimulatedNode(self.lib, sim, ib, keep_files_open=keep_files_open)
            for spec in faults:
                node.inject(spec)
            if attribution:
                node.enable_attribution(tempfile.mkdtemp(prefix=f"laggard-sim-proc-{name}-", dir=shm), pods_url=pods_url)
        except BaseException:
            ib.close()
            shutil.rmtree(ib.root, ignore_errors=True)
            raise
        self.nodes.append(node)
        return node

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.nodes.clear()
        uninstall_simulated_nvml()
