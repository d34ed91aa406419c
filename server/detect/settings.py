"""Detection thresholds: every number a rule compares against, with its default and why.
Set through the environment as LAGGARD_DETECTION__<NAME> (e.g. LAGGARD_DETECTION__CLOCK_DROP=0.1)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class DetectionSettings(BaseModel):
    # --- peers ---------------------------------------------------------------------------
    min_peers: int = Field(3, description="Busy GPUs (or ports) of one node and peer group needed for peer statistics; fewer use absolute rules "
                                          "only. Three: the median of three is one healthy member's reading when one is slow (at 4, a node "
                                          "of 3 GPUs of a job, or 4 with one idle, had no peers: recall 0.868 on a 3-GPU fleet).")
    stale_after_s: float = Field(30.0, description="A node whose newest sample is this much (sample time) behind its cluster's newest no longer "
                                                   "holds back the cluster's judged_until.")
    lateness_s: float = Field(900.0, description="A node's samples are judged when they arrive, in the node's own order, up to this far (sample "
                                                 "time) behind the newest sample of its cluster: a spool replayed after a 10-minute outage is judged "
                                                 "like live data. Older ones are stored, counted (laggard_detector_late_samples_total) and not "
                                                 "judged.")
    across_window_s: float = Field(60.0, description="Nodes are compared with the other nodes of their peer group over windows this long, aligned "
                                                     "across them (boundaries at multiples of it), their counters interpolated at both ends.")
    across_gauge_window_s: float = Field(5.0, description="Power limits, and the free clocks of GPUs of nodes too small for peers inside "
                                                          "them, are compared between nodes over windows this long, aligned as the "
                                                          "others: gauges need no interpolation, and a window of 60 s took one to two "
                                                          "minutes to find a slow GPU of a one-GPU node.")
    across_min_nodes: int = Field(4, description="Steady units a peer group needs in a window for the comparison between nodes (a "
                                                  "node's figure is one unit; a GPU of a node with fewer than min_peers of the group "
                                                  "is one), from at least two nodes.")
    missing_after_samples: int = Field(2, description="A GPU missing from this many consecutive samples of its (still reporting) node is flagged as "
                                                      "lost.")

    # --- persistence -------------------------------------------------------------------
    window_n: int = Field(3, description="Open an episode when k of the last n evaluated instants found the condition...")
    window_k: int = Field(2, description="...k of them...")
    open_after_s: float = Field(5.0, description="...once the run of hits spans this much sample time: at 1 s sampling a 2-3 s dip is a transient, "
                                                 "not a straggler; at 5 s two samples suffice.")
    clear_after: int = Field(3, description="Resolve after this many consecutive clean instants (hysteresis)...")
    clear_after_s: float = Field(30.0, description="...spanning at least this much sample time, so a fault that shows only in some phases of a "
                                                   "training step stays one episode.")
    rate_window_s: float = Field(60.0, description="Error counters are judged on their increase over this much sample time.")

    # --- clocks, thermal, power --------------------------------------------------------
    clock_drop: float = Field(0.08, description="SM clock ratio this far (fraction) below the peer median is a deviation.")
    clock_z: float = Field(4.0, description="...and at least this many robust standard deviations below it.")
    clock_noise_floor: float = Field(0.01, description="Smallest spread assumed for the clock ratio (1% of max).")
    clock_critical_drop: float = Field(0.25, description="A drop this large is critical rather than a warning.")
    hot_delta_c: float = Field(10.0, description="'Far hotter than peers': this many °C above the peer median.")
    power_limit_drop: float = Field(0.05, description="Enforced power limit this far (fraction) below the peers' median.")
    power_capped_share: float = Field(0.5, description="A power-capped GPU's lower clock is a slower GPU only where at least this share of its busy "
                                                       "peers are power-capped too; else it has more work than they have.")
    power_capped_open_after_s: float = Field(180.0, description="...and only once that has lasted this much sample time: a GPU that needs more "
                                                               "power than its peers for their work (silicon, cooling) does so for hours, "
                                                               "whereas GPUs given different work trade places within minutes.")

    # --- links and errors --------------------------------------------------------------
    nvlink_bw_drop: float = Field(0.3, description="NVLink throughput this far (fraction) below peers doing the same work.")
    nvlink_errors_in_window: int = Field(5, description="NVLink CRC/replay/recovery errors within rate_window_s that count as 'rising'.")
    pcie_replays_in_window: int = Field(5, description="PCIe replays within rate_window_s that count as 'rising'.")
    ib_errors_in_window: int = Field(5, description="IB symbol/receive errors within rate_window_s that count as 'rising'.")
    ib_bw_drop: float = Field(0.3, description="Port throughput this far (fraction) below peer ports while its node is busy.")
    ib_wait_factor: float = Field(5.0, description="Transmit-wait this many times the peer median is congestion.")
    # Added with the rules (server/detect/rules): throughput needs a floor and a spread test.
    bw_z: float = Field(3.0, description="NVLink or port throughput must also be this many robust standard deviations below the peer median: a group "
                                         "whose members do different work (pipeline stages) spreads wide and is not judged.")
    bw_noise_floor: float = Field(0.05, description="Smallest spread assumed for throughput, as a fraction of the peer median.")
    nvlink_min_bps: float = Field(1e9, description="NVLink throughput is judged only when the peer median moves at least this many bytes/s (a "
                                                   "compute phase moves next to nothing).")
    shared_tol: float = Field(0.1, description="A low throughput that another member shares (within this fraction of the median) is the traffic of "
                                              "their work, not their links: a GPU's NVLink figure shared by a busy peer of its node (a "
                                              "tensor-parallel replica under less load than the others), a node's port figure shared by another "
                                              "node of its job (the first and last stages of a pipeline-parallel job).")
    ib_min_bps: float = Field(1e8, description="Port throughput is judged only when the peer median moves at least this many bytes/s.")
    ib_wait_floor_per_s: float = Field(2e5, description="The peer median transmit-wait (ticks/s) is taken as at least this, so congestion needs "
                                                        "ib_wait_factor times it (1e6 ticks/s) whatever the peers show: a quiet fabric's near-0 "
                                                        "median does not turn a trickle into a huge ratio. The peers are the node's other ports over "
                                                        "the same interval, so the ratio itself is trusted down to there.")

    # --- events --------------------------------------------------------------------------
    hardware_xids: list[int] = Field(
        [48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 140],
        description="XIDs that mean the GPU (not the program) is at fault. 13, 31, 43 are application errors and never flag.",
    )
