"""What the simulated calls share: which node a thread is on, init counts, and the handle tables.

One library serves many nodes at once: device handles are unique per SimGpu, and the per-node
calls (init/shutdown, count, handle lookup, system versions) resolve through a thread-local
current node. Opaque objects the caller allocates (event sets, GPM samples) are kept by the
address handed out for them.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import pynvml as N

from agent.sim.gpu import SimGpu, SimNode, gpu_by_handle
from agent.sim.libnvml.abi import NvmlReturn

T = TypeVar("T")


class OpaqueTable(Generic[T]):
    """Objects the caller holds as opaque pointers (nvmlEventSet_t, nvmlGpmSample_t), by address."""

    def __init__(self, first_address: int) -> None:
        self._addresses = itertools.count(first_address, 0x100)
        self._objects: dict[int, T] = {}

    def new(self, make: Callable[[int], T]) -> T:
        """Call under the driver's lock."""
        obj = make(next(self._addresses))
        self._objects[obj.address] = obj  # type: ignore[attr-defined]
        return obj

    def get(self, address: int | None) -> T:
        obj = self._objects.get(address or 0)
        if obj is None:
            raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def free(self, address: int | None) -> T:
        """Call under the driver's lock."""
        obj = self._objects.pop(address or 0, None)
        if obj is None:
            raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def __len__(self) -> int:
        return len(self._objects)


class Driver:
    def __init__(self, default_node: SimNode | None) -> None:
        self.default_node = default_node
        self.lock = threading.RLock()
        self._local = threading.local()  # .stack: the nodes entered; .fn: the function being called
        self.inits: dict[SimNode, int] = {}
        self.event_sets: OpaqueTable = OpaqueTable(0x7F000000)
        self.gpm_samples: OpaqueTable = OpaqueTable(0x7E000000)
        # handle -> GPU, in front of gpu_by_handle (a WeakValueDictionary, slow per call);
        # an entry whose GPU has had a new handle since is dropped on its next use.
        self._gpus: dict[int, SimGpu] = {}

    # -- the calling thread --------------------------------------------------------------
    def enter_node(self, node: SimNode) -> None:
        self._local.__dict__.setdefault("stack", []).append(node)

    def leave_node(self) -> None:
        self._local.stack.pop()

    @property
    def current_node(self) -> SimNode | None:
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else self.default_node

    def calling(self, name: str) -> None:
        """The NVML function this thread is in: a GPU's call_errors are per function."""
        self._local.fn = name

    # -- what every call checks first ----------------------------------------------------
    def node(self) -> SimNode:
        node = self.current_node
        if node is None:
            raise NvmlReturn(N.NVML_ERROR_DRIVER_NOT_LOADED)  # like a machine without the driver
        return node

    def initialized_node(self) -> SimNode:
        node = self.node()
        if self.inits.get(node, 0) <= 0:
            raise NvmlReturn(N.NVML_ERROR_UNINITIALIZED)
        return node

    def check(self, gpu: SimGpu) -> SimGpu:
        if self.inits.get(gpu.node, 0) <= 0:
            raise NvmlReturn(N.NVML_ERROR_UNINITIALIZED)
        if gpu.lost:
            raise NvmlReturn(N.NVML_ERROR_GPU_IS_LOST)
        if gpu.call_errors:
            code = gpu.call_errors.get(self._local.fn)
            if code:
                raise NvmlReturn(code)
        return gpu

    def device(self, handle: int | None) -> SimGpu:
        gpu = self._gpus.get(handle)
        if gpu is None or gpu.handle != handle:
            self._gpus.pop(handle, None)
            gpu = gpu_by_handle(handle)
            if gpu is None:
                raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
            self._gpus[handle] = gpu
        return self.check(gpu)
