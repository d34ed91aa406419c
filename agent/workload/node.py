"""The entry point for the sampling loop: NVML device handles in, one Workload | None per GPU out.

    attribution = open_attribution(proc_root=cfg.proc_root, node=cfg.node)
    workloads = attribution.read(handles)        # once per sample, all GPUs, in index order
    # or, from a per-GPU reader:  attribution.read_gpu(gpu.index, handle)
    attribution.counters()                       # reason → count, for the agent's /metrics
    attribution.close()
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from agent.workload.attribution import Attributor
from agent.workload.kubernetes import KubePods
from agent.workload.nvml import NvmlProcesses
from agent.workload.procfs import DEFAULT_PROC_ROOT, ProcFs
from agent.workload.record import Workload
from agent.workload.slurm import Scontrol


class NodeAttribution:
    def __init__(self, attributor: Attributor, processes: NvmlProcesses | None = None) -> None:
        self.attributor = attributor
        self.processes = processes if processes is not None else NvmlProcesses()

    def read(self, handles: Sequence[object | None]) -> list[Workload | None]:
        """A None handle (a lost GPU) gives None."""
        return self.attributor.attribute(self.processes.read_all(handles))

    def read_gpu(self, index: int, handle: object | None) -> Workload | None:
        return self.attributor.attribute_gpu(index, None if handle is None else self.processes.read(handle))

    def counters(self) -> dict[str, int]:
        return {**self.processes.errors, **self.attributor.counters()}

    def close(self) -> None:
        for part in (self.attributor.pods, self.attributor.slurm):
            close = getattr(part, "close", None)
            if close is not None:
                close()


def open_attribution(*, proc_root: str = DEFAULT_PROC_ROOT, node: str | None = None, kubernetes: str = "auto",
                     pods_url: str | None = None, token_file: str | None = None, ca_file: str | None = None,
                     scontrol: str | None = None, env: Mapping[str, str] | None = None) -> NodeAttribution:
    """kubernetes: "auto" (in a pod: this node's pods from the API server), "off"; `pods_url`
    (any URL answering a PodList of this node's pods) overrides the in-cluster API server.
    scontrol: path of the binary to name Slurm jobs whose processes' environ does not; None: don't."""
    env = os.environ if env is None else env
    pods: KubePods | None = None
    if kubernetes != "off":
        if pods_url:
            pods = KubePods(pods_url, token_file=token_file, ca_file=ca_file)
        elif node:
            pods = KubePods.in_cluster(node, env=env)
    slurm = Scontrol(scontrol) if scontrol else None
    return NodeAttribution(Attributor(ProcFs(proc_root), pods=pods, slurm=slurm))
