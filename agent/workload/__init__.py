"""Which workload uses each GPU (issue #15 item 1, the agent side; docs/attribution.md).

One reader per concern, each behind one lookup, the OS seam being a path:

  nvml.NvmlProcesses       handle → the GPU's processes (PID, GPU memory), or None
  procfs.ProcFs            pid → cgroup / comm / environ text under a /proc root
  cgroup                   cgroup text → pod UID, container id, Slurm job and step (pure)
  kubernetes.KubePods      pod UID → namespace, pod, job, container names (this node's PodList)
  slurm.Scontrol           Slurm job id → job name and user (`scontrol -o show job`)
  record.Workload          the per-GPU record (kind, job, pod, Slurm job, process, ...)
  attribution.Attributor   per-GPU processes → per-GPU Workload (the dominant one), counted failures
  node.NodeAttribution     the entry point: NVML handles → per-GPU Workload
"""

from agent.workload.attribution import Attributor
from agent.workload.cgroup import CgroupMatch, classify_cgroup_file, classify_path
from agent.workload.kubernetes import KubePods, PodInfo, job_of
from agent.workload.node import NodeAttribution, open_attribution
from agent.workload.nvml import GpuProcess, NvmlProcesses
from agent.workload.procfs import ProcFs
from agent.workload.record import IDLE, Workload
from agent.workload.slurm import Scontrol, SlurmJob

__all__ = [
    "IDLE", "Attributor", "CgroupMatch", "GpuProcess", "KubePods", "NodeAttribution", "NvmlProcesses", "PodInfo", "ProcFs",
    "Scontrol", "SlurmJob", "Workload", "classify_cgroup_file", "classify_path", "job_of", "open_attribution",
]
