"""A collector fed by a simulated fleet with faults injected, for the status page's browser test
and its screenshots (bench/ui_screenshots.py): five 8-GPU nodes running the real agent code
(sampling loop and pusher, 1 s) on the simulated NVML library and IB tree, healthy for a while,
then a thermal GPU, a GPU whose clock is stuck low, one with NVLink links down and a degraded
IB port; two idle GPUs throughout. Authentication is on unless asked otherwise: the agents push
with an agent token; read_token opens the page."""

from __future__ import annotations

import threading
import time

import httpx

from server.app import create_app
from server.auth.store import create_token
from server.detect.settings import DetectionSettings
from server.serve import start_in_thread
from server.settings import Settings
from server.store.engine import make_engine
from tests.metrics.tools import stop_agents

CLUSTER = "sim"
FAULTS = {1: ["gpu3:thermal"], 2: ["gpu5:clocks_stuck_low", "gpu1:nvlink_down=4"], 3: ["ib2:degraded"]}
IDLE = {4: [6, 7]}
# What the detector must find: (node, GPU) → cause, and node-level (a port) node → cause.
EXPECTED_GPUS = {("sim-node-1", 3): "thermal", ("sim-node-2", 5): "clock", ("sim-node-2", 1): "nvlink"}
EXPECTED_NODES = {"sim-node-3": "network"}


class UiFleet:
    def __init__(self, db_path: str, *, nodes: int = 5, insecure: bool = False, interval: float = 1.0):
        from agent.sim.fleet import SimFleet

        self.settings = Settings(database_url=f"sqlite:///{db_path}", insecure=insecure, detection=DetectionSettings(open_after_s=0),
                                 detection_poll_s=0.2, retention_interval_s=3600)
        self.server = start_in_thread(create_app(self.settings))
        self.url = self.server.url
        self.engine = make_engine(self.settings.database_url)
        self.read_token = None if insecure else self.token("read")
        self.agent_token = None if insecure else self.token("agent", cluster=CLUSTER)
        self.fleet = SimFleet()
        self.stop = threading.Event()
        self.agents: list[tuple[object, threading.Thread]] = []
        self.nodes = []
        try:
            for i in range(nodes):
                self._start_node(i, interval)
        except BaseException:
            self.close()
            raise

    def _start_node(self, i: int, interval: float) -> None:
        from agent.push import Pusher
        from agent.runner import Runner

        node = self.fleet.add_node(f"sim-node-{i}", model="h100", gpus=8, seed=i)
        if i in IDLE:
            node.sim.set_workload("idle", gpus=IDLE[i])
        info = {"version": "test", "driver": node.driver_version(), "cuda": node.cuda_version()}
        pusher = Pusher(self.url, node=node.name, cluster=CLUSTER, labels={"job": "llm-train", "partition": "gpu"}, agent_info=info,
                        token=self.agent_token, batch_size=1, max_delay=interval).start()
        thread = Runner(node, pusher, interval=interval, read_nics=node.read_nics, stop=self.stop).start()
        self.nodes.append(node)
        self.agents.append((pusher, thread))

    def token(self, *scopes: str, cluster: str | None = None) -> str:
        with self.engine.begin() as conn:
            return create_token(conn, scopes=frozenset(scopes), cluster=cluster, name="ui-test")[0]

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.read_token}"} if self.read_token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def inject_faults(self) -> None:
        for i, specs in FAULTS.items():
            for spec in specs:
                self.nodes[i].inject(spec)

    def wait_for_episodes(self, timeout: float = 90.0) -> list[dict]:
        """The active episodes once every expected one is there."""
        deadline = time.monotonic() + timeout
        found: list[dict] = []
        with self.client() as c:
            while time.monotonic() < deadline:
                found = c.get("/api/v1/stragglers").json()["stragglers"]
                gpus = {(s["node"], s["gpu"]): s["cause"] for s in found if s["gpu"] is not None}
                nodes = {s["node"]: s["cause"] for s in found if s["gpu"] is None}
                if all(gpus.get(k) == v for k, v in EXPECTED_GPUS.items()) and all(nodes.get(k) == v for k, v in EXPECTED_NODES.items()):
                    return found
                time.sleep(0.5)
        raise AssertionError(f"the detector did not flag the injected faults within {timeout:.0f} s: {found}")

    def close(self) -> None:
        stop_agents(self.stop, self.agents, self.fleet)
        self.server.stop()
        self.engine.dispose()


def started(db_path: str, *, healthy_s: float = 12.0, **kwargs) -> UiFleet:
    """A fleet that ran healthy for `healthy_s` (so the charts show the time before the onset),
    then got its faults and has had them flagged."""
    fleet = UiFleet(db_path, **kwargs)
    try:
        time.sleep(healthy_s)
        fleet.inject_faults()
        fleet.wait_for_episodes()
    except BaseException:
        fleet.close()
        raise
    return fleet
