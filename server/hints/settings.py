"""Hint settings: how episodes become actions and capacities, how long a hint outlives its
episode, and how the scheduler integrations behave. Set through the environment as
LAGGARD_HINTS__<NAME> (e.g. LAGGARD_HINTS__COOLDOWN_S=600,
LAGGARD_HINTS__ACTIONS='{"thermal:warning": "avoid"}')."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from server.hints.remedy import XID_REMEDIES, RemedyOrNone

Action = Literal["ok", "rebalance", "avoid", "drain"]
# Worst last: a node or GPU with several problems takes the gravest action among them.
ACTIONS: tuple[Action, ...] = ("ok", "rebalance", "avoid", "drain")
RANK = {a: i for i, a in enumerate(ACTIONS)}

# The default mapping, keyed "cause:severity" (or "cause" for both severities). Overrides in
# HintSettings.actions are laid over it key by key; "cause:severity" wins over "cause".
DEFAULT_ACTIONS: dict[str, Action] = {
    # Slower but usable: give it a smaller shard. Critical (the clock fell by the detector's
    # clock_critical_drop, or a HW thermal / power brake bit) means it worsened: stop placing
    # new work there, but a running job may still keep it with a capacity-sized shard.
    "thermal:warning": "rebalance",
    "thermal:critical": "avoid",
    "power:warning": "rebalance",
    "power:critical": "avoid",
    "clock:warning": "rebalance",
    "clock:critical": "avoid",
    # Hardware faults: take the GPU (and its node, for a scheduler) out.
    "hw_slowdown": "drain",
    "xid": "drain",
    "ecc": "drain",
    "lost": "drain",
    # Links. A slow link slows every rank of a collective, which no shard sizing fixes:
    # links down or a downtrained / down port need a repair (drain); errors rising or
    # throughput below peers keep the GPU usable but unwelcome for new work.
    "nvlink:warning": "rebalance",
    "nvlink:critical": "drain",
    "pcie:warning": "rebalance",
    "pcie:critical": "avoid",
    "network:warning": "avoid",
    "network:critical": "drain",
}


class HintSettings(BaseModel):
    # --- mapping ---------------------------------------------------------------------------
    actions: dict[str, Action] = Field(
        default_factory=dict,
        description="Overrides of the cause/severity → action table, keyed 'cause:severity' or 'cause' "
        "(e.g. {\"thermal:critical\": \"rebalance\", \"pcie\": \"ok\"}); laid over the defaults (docs/rebalancing.md).",
    )
    unknown_cause_action: Action = Field("avoid", description="Action for a cause the table does not name (a newer detector).")
    avoid_after_s: float | None = Field(
        1800.0,
        description="A rebalance hint that has lasted this long (sample time, counted from `since`) becomes avoid: "
        "the straggler persists. None: never.",
    )

    # --- capacity --------------------------------------------------------------------------
    comm_fraction: float = Field(
        0.25, ge=0.0, le=1.0,
        description="Share of a step spent moving data over NVLink / the network: turns a link's bandwidth ratio r "
        "into a capacity 1 / ((1 - f) + f / r).",
    )
    io_fraction: float = Field(0.1, ge=0.0, le=1.0, description="The same for PCIe (host ↔ GPU transfers).")
    fallback_capacity: dict[Literal["warning", "critical"], float] = Field(
        default_factory=lambda: {"warning": 0.9, "critical": 0.7},
        description="Capacity when the evidence carries no ratio to derive it from (error counters rising, ...).",
    )

    # --- clearing ------------------------------------------------------------------------
    cooldown_s: float = Field(
        900.0, ge=0.0,
        description="A hint clears only once its episode has resolved and this much SAMPLE time has passed since "
        "(measured against the newest sample time of the cluster), so a flapping GPU stays out of the pool.",
    )
    hold_until_remedy: bool = Field(
        True,
        description="A hardware fault whose remedy (NVIDIA's XID catalogue) is a GPU reset, a reboot or a field check keeps "
        "its hint past the cool-down until the remedy is seen (the node rebooted after it and the GPU was sampled clean "
        "since, or the GPU was replaced) or an operator acknowledges it (laggard ack); server/hints/remedy.py.",
    )
    xid_remedies: dict[int, RemedyOrNone] = Field(
        default_factory=dict,
        description="Overrides of the XID → remedy table (reset / reboot / field / none), e.g. {\"74\": \"field\"}.",
    )
    history_s: float = Field(
        86400.0, description="How far back (sample time) resolved episodes are read to find when a hint began (`since`)."
    )

    # --- serving ---------------------------------------------------------------------------
    cache_ttl_s: float = Field(2.0, ge=0.0, description="Computed hints are served from memory this long.")
    max_stale_s: float = Field(
        60.0, ge=0.0,
        description="While a refresh runs (or the database is slow or down), hints up to this old are served rather "
        "than making a scheduler wait.",
    )
    refresh_ahead_s: float = Field(
        1.0, ge=0.0,
        description="A snapshot this close to the end of cache_ttl_s is recomputed in the background while it is still "
        "served, so that a steady stream of requests (kube-scheduler's) never waits for a computation; 0: off.",
    )

    # --- Kubernetes ------------------------------------------------------------------------
    scheduler_cluster: str | None = Field(
        None, description="Cluster whose hints the scheduler extender uses (None: every cluster; a name in several takes the worst)."
    )
    filter_actions: list[Action] = Field(
        default_factory=lambda: ["avoid", "drain"], description="Nodes with these actions fail the extender's filter."
    )
    unresolvable_actions: list[Action] = Field(
        default_factory=lambda: ["drain"],
        description="...of which these are reported in FailedAndUnresolvableNodes (preemption cannot help), the rest in FailedNodes.",
    )
    unknown_node_score: int = Field(
        10, ge=0, le=10,
        description="Prioritize score of a node Laggard knows nothing about. Neutral: the score of a healthy node, so "
        "the extender only ranks down nodes it knows to be slow.",
    )
    taint_key: str = Field("laggard.io/straggler", description="The taint k8s-sync owns (value: the cause).")
    taint_effects: dict[Action, Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = Field(
        default_factory=lambda: {"avoid": "PreferNoSchedule", "drain": "NoSchedule"},
        description="Taint effect per action; actions not listed get no taint.",
    )
    condition_type: str = Field("LaggardStraggler", description="The node condition k8s-sync owns.")

    # --- Slurm -----------------------------------------------------------------------------
    scontrol_path: str = Field("scontrol", description="scontrol executable used by slurm-sync.")
    slurm_drain_actions: list[Action] = Field(default_factory=lambda: ["drain"], description="slurm-sync drains nodes with these actions.")
    slurm_resume_actions: list[Action] = Field(
        default_factory=lambda: ["ok"], description="slurm-sync resumes nodes it drained once their action is one of these."
    )
    slurm_reason_prefix: str = Field(
        "laggard:",
        description="Prefix of the drain Reason slurm-sync writes; it resumes only nodes whose Reason starts with it. ASCII, and "
        "it must contain 'laggard' so that it can never claim someone else's drains (e.g. 'NHC: laggard:' for sites running "
        "LBNL NHC, not 'NHC:'); docs/rebalancing.md.",
    )
    slurm_avoid_actions: list[Action] = Field(
        default_factory=lambda: ["avoid"],
        description="slurm-sync raises the Weight of nodes with these actions (Slurm allocates the lowest weights first) and "
        "restores it once their action is none of these nor a drain action. []: never.",
    )
    slurm_avoid_weight: int = Field(
        1_000_000, ge=1, le=4_294_967_280,
        description="Added to an avoid node's Weight (capped at Slurm's largest, 4294967280).",
    )

    @field_validator("slurm_reason_prefix")
    @classmethod
    def _own_prefix(cls, prefix: str) -> str:
        prefix = " ".join(prefix.split())
        if not prefix.isascii() or not prefix.isprintable():
            raise ValueError("the reason prefix must be printable ASCII (Slurm reasons are)")
        if "laggard" not in prefix.lower():
            raise ValueError(f"the reason prefix {prefix!r} must contain 'laggard', or slurm-sync could take others' drains "
                             "for its own and resume them (e.g. 'NHC: laggard:', not 'NHC:')")
        if len(prefix) > 64:
            raise ValueError("the reason prefix is longer than 64 characters")
        return prefix

    @field_validator("actions")
    @classmethod
    def _known_keys(cls, actions: dict[str, Action]) -> dict[str, Action]:
        for key in actions:
            cause, colon, severity = key.partition(":")
            if not cause or (colon and severity not in ("warning", "critical")):
                raise ValueError(f"bad key {key!r}: use 'cause' or 'cause:warning' / 'cause:critical'")
        return actions

    def remedy_table(self) -> dict[int, RemedyOrNone]:
        return {**XID_REMEDIES, **self.xid_remedies}

    def action_table(self) -> dict[str, Action]:
        """The effective mapping: the defaults with the overrides laid over them."""
        table = dict(DEFAULT_ACTIONS)
        # Bare causes first (each replaces both severities), then 'cause:severity', which wins.
        for key, action in sorted(self.actions.items(), key=lambda kv: ":" in kv[0]):
            if ":" not in key:
                table.pop(f"{key}:warning", None)
                table.pop(f"{key}:critical", None)
            table[key] = action
        return table
