"""The pure part of the hints, table-driven: cause/severity → action (with overrides), evidence →
capacity, the cool-down chain in sample time, escalation, and how GPU, node-level and node
hints combine."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from server.hints.compute import KnownNode, compute_hints, entity_hint
from server.hints.cooldown import current_chain
from server.hints.mapping import action_for, amdahl, capacity_for
from server.hints.settings import HintSettings

# --- cause / severity → action -------------------------------------------------------------

ACTION_CASES = [
    # cause, severity, overrides, expected
    ("thermal", "warning", {}, "rebalance"),
    ("thermal", "critical", {}, "avoid"),
    ("power", "warning", {}, "rebalance"),
    ("power", "critical", {}, "avoid"),
    ("clock", "warning", {}, "rebalance"),
    ("clock", "critical", {}, "avoid"),
    ("hw_slowdown", "critical", {}, "drain"),
    ("hw_slowdown", "warning", {}, "drain"),
    ("xid", "critical", {}, "drain"),
    ("ecc", "critical", {}, "drain"),
    ("lost", "critical", {}, "drain"),
    ("nvlink", "warning", {}, "rebalance"),
    ("nvlink", "critical", {}, "drain"),
    ("pcie", "warning", {}, "rebalance"),
    ("pcie", "critical", {}, "avoid"),
    ("network", "warning", {}, "avoid"),
    ("network", "critical", {}, "drain"),
    ("gremlins", "warning", {}, "avoid"),  # a cause the table does not know: unknown_cause_action
    ("thermal", "critical", {"thermal:critical": "rebalance"}, "rebalance"),
    ("thermal", "warning", {"thermal:critical": "rebalance"}, "rebalance"),
    ("pcie", "critical", {"pcie": "ok"}, "ok"),  # a bare cause replaces both severities
    ("pcie", "warning", {"pcie": "ok"}, "ok"),
    ("thermal", "critical", {"thermal": "drain", "thermal:warning": "rebalance"}, "drain"),
    ("thermal", "warning", {"thermal": "drain", "thermal:warning": "rebalance"}, "rebalance"),
    ("thermal", "warning", {"thermal:warning": "rebalance", "thermal": "drain"}, "rebalance"),  # order does not matter
    ("xid", "critical", {"xid": "avoid"}, "avoid"),
]


@pytest.mark.parametrize(("cause", "severity", "overrides", "expected"), ACTION_CASES)
def test_action_table(cause, severity, overrides, expected):
    assert action_for(cause, severity, HintSettings(actions=overrides)) == expected


@pytest.mark.parametrize("key", ["thermal:fatal", ":warning", "thermal:"])
def test_bad_override_keys_are_refused(key):
    with pytest.raises(ValidationError):
        HintSettings(actions={key: "avoid"})


def test_overrides_come_from_the_environment(monkeypatch):
    from server.settings import Settings

    monkeypatch.setenv("LAGGARD_HINTS__ACTIONS", '{"network:warning": "rebalance"}')
    monkeypatch.setenv("LAGGARD_HINTS__COOLDOWN_S", "120")
    cfg = Settings().hints
    assert cfg.cooldown_s == 120.0
    assert action_for("network", "warning", cfg) == "rebalance"
    assert action_for("network", "critical", cfg) == "drain"


# --- evidence → capacity -------------------------------------------------------------------

CAPACITY_CASES = [
    # cause, severity, evidence, action, expected capacity
    # SM clock against the busy peers' median: 1 + clock_deviation.
    ("thermal", "critical", {"metric": "sm_clock_mhz", "value": 1400, "peer_median": 1976.0, "deviation": -0.291,
                             "clock_deviation": -0.291, "sm_clock_mhz": 1400, "sm_clock_max_mhz": 1980}, "avoid", 0.709),
    # power limit below peers: the headline deviation is the power limit's, the clock's counts.
    ("power", "warning", {"metric": "power_limit_w", "deviation": -0.314, "clock_deviation": -0.15}, "rebalance", 0.85),
    ("power", "warning", {"metric": "power_limit_w", "deviation": -0.3, "sm_clock_mhz": 1683, "peer_sm_clock_mhz": 1980.0}, "rebalance", 0.85),
    # a hardware bit judged without peers: against the GPU's own max clock
    ("thermal", "critical", {"metric": "sm_clock_mhz", "value": 990, "sm_clock_mhz": 990, "sm_clock_max_mhz": 1980}, "avoid", 0.5),
    ("clock", "warning", {"metric": "sm_clock_mhz", "deviation": -0.1}, "rebalance", 0.9),
    ("clock", "warning", {"clock_deviation": 0.05}, "rebalance", 1.0),  # never above 1
    ("clock", "warning", {}, "rebalance", 0.9),  # no ratio: fallback_capacity[warning]
    ("clock", "critical", {}, "avoid", 0.7),
    ("hw_slowdown", "critical", {"clock_deviation": -0.5}, "drain", 0.0),  # drain: 0 whatever the evidence
    ("ecc", "critical", {"metric": "ecc_uncorrected_new", "value": 2}, "drain", 0.0),
    # links: Amdahl with comm_fraction 0.25 on the bandwidth ratio
    ("nvlink", "critical", {"metric": "nvlink_links_up", "links_up": 14, "links_total": 18}, "avoid", 0.933),
    ("nvlink", "warning", {"metric": "nvlink_bps", "nvlink_deviation": -0.4, "links_up": 18, "links_total": 18}, "rebalance", 0.857),
    ("nvlink", "warning", {"metric": "nvlink_errors_in_window", "links_up": 18, "links_total": 18}, "rebalance", 0.9),
    ("network", "critical", {"metric": "rate_gbps", "rate_gbps": 200.0, "peer_rate_gbps": 400.0}, "avoid", 0.8),
    ("network", "warning", {"metric": "bps", "bps": 1.2e10, "peer_bps": 2e10, "rate_gbps": 400.0}, "avoid", 0.857),
    ("network", "critical", {"metric": "state", "value": "DOWN", "rate_gbps": 400.0}, "avoid", 0.0),
    ("network", "warning", {"metric": "xmit_wait_per_s", "xmit_wait_per_s": 5e7}, "avoid", 0.9),
    # PCIe: Amdahl with io_fraction 0.1 on lanes x generation
    ("pcie", "critical", {"metric": "pcie_width", "pcie_width": 8, "pcie_width_max": 16, "pcie_gen": 5, "pcie_gen_max": 5}, "avoid", 0.909),
    ("pcie", "critical", {"metric": "pcie_gen", "pcie_width": 16, "pcie_width_max": 16, "pcie_gen": 3, "pcie_gen_max": 5}, "avoid", 0.769),
    ("pcie", "warning", {"metric": "pcie_replays_in_window", "pcie_width": 16, "pcie_width_max": 16, "pcie_gen": 5, "pcie_gen_max": 5},
     "rebalance", 0.9),
    ("xid", "critical", {"metric": "xid", "value": [79]}, "avoid", 0.7),  # xid overridden to avoid: fallback
    ("thermal", "warning", {"clock_deviation": "n/a", "sm_clock_mhz": True}, "rebalance", 0.9),  # junk is ignored
]


@pytest.mark.parametrize(("cause", "severity", "evidence", "action", "expected"), CAPACITY_CASES)
def test_capacity_from_evidence(cause, severity, evidence, action, expected):
    assert capacity_for(cause, severity, evidence, action, HintSettings()) == expected


def test_capacity_fractions_are_settings():
    cfg = HintSettings(comm_fraction=1.0, fallback_capacity={"warning": 0.8, "critical": 0.5})
    assert capacity_for("network", "critical", {"rate_gbps": 200.0, "peer_rate_gbps": 400.0}, "avoid", cfg) == 0.5
    assert capacity_for("nvlink", "warning", {}, "rebalance", cfg) == 0.8


@pytest.mark.parametrize(("ratio", "fraction", "expected"), [(1.0, 0.25, 1.0), (0.5, 0.25, 0.8), (0.5, 0.0, 1.0), (0.0, 0.25, 0.0), (0.5, 1.0, 0.5)])
def test_amdahl(ratio, fraction, expected):
    assert amdahl(ratio, fraction) == pytest.approx(expected)


# --- cool-down, in sample time ---------------------------------------------------------------


def ep(onset, resolved=None, *, id=1, cause="thermal", severity="warning", evidence=None):
    return {"id": id, "onset": onset, "resolved_at": resolved, "cause": cause, "severity": severity,
            "evidence": evidence or {}, "summary": f"{cause} {id}", "gpu": 0}


CHAIN_CASES = [
    # episodes, now, expected (since, [live ids], clears_at) or None; cooldown 100
    ([], 50, None),
    ([ep(10)], 50, (10, [1], math.inf)),
    ([ep(10, 40)], 120, (10, [1], 140)),  # resolved, cooling down
    ([ep(10, 40)], 140, None),  # cool-down over exactly now
    ([ep(10, 40)], 1000, None),
    ([ep(10, 40, id=1), ep(90, 120, id=2)], 200, (10, [2], 220)),  # a flap inside the cool-down: one hint since 10
    ([ep(0, 10, id=1), ep(100, 105, id=2), ep(190, id=3)], 300, (0, [3], math.inf)),  # a chain of flaps
    ([ep(0, 10, id=1), ep(150, id=3)], 300, (150, [3], math.inf)),  # cleared in between: a new hint
    ([ep(0, id=1), ep(20, 30, id=2)], 500, (0, [1], math.inf)),  # open and resolved together
]


@pytest.mark.parametrize(("episodes", "now", "expected"), CHAIN_CASES)
def test_cooldown_chain(episodes, now, expected):
    chain = current_chain(episodes, now, 100.0)
    if expected is None:
        assert chain is None
    else:
        since, live, clears = expected
        assert (chain.since, [e["id"] for e in chain.live], chain.clears_at) == (since, live, clears)


ESCALATION_CASES = [
    # avoid_after_s, now, expected action
    (1800.0, 1799.0, "rebalance"),
    (1800.0, 1800.0, "avoid"),  # the straggler persists
    (None, 10**6, "rebalance"),
]


@pytest.mark.parametrize(("avoid_after", "now", "expected"), ESCALATION_CASES)
def test_rebalance_escalates_to_avoid_when_it_persists(avoid_after, now, expected):
    hint = entity_hint([ep(0, evidence={"clock_deviation": -0.1})], now=now, cfg=HintSettings(avoid_after_s=avoid_after))
    assert (hint.action, hint.capacity, hint.since) == (expected, 0.9, 0)
    assert hint.reasons[0]["action"] == expected
    assert ("escalated" in hint.reasons[0]) == (expected == "avoid")


def test_a_resolved_episode_keeps_its_hint_until_the_cool_down_passed():
    cfg = HintSettings(cooldown_s=300)
    episodes = [ep(100, 200, severity="critical", evidence={"clock_deviation": -0.3})]
    during = entity_hint(episodes, now=499, cfg=cfg)
    assert (during.action, during.capacity, during.since) == ("avoid", 0.7, 100)
    assert during.reasons[0]["resolved_at"] == 200 and during.reasons[0]["clears_at"] == 500
    assert entity_hint(episodes, now=500, cfg=cfg).action == "ok"


def test_an_episode_mapped_to_ok_gives_no_hint():
    hint = entity_hint([ep(0, cause="pcie")], now=10, cfg=HintSettings(actions={"pcie": "ok"}))
    assert (hint.action, hint.capacity, hint.since, hint.reasons) == ("ok", 1.0, None, [])


# --- node, GPU and node-level hints together --------------------------------------------------


def episode(node, gpu, cause, severity, onset, *, cluster="prod", resolved=None, evidence=None, id=1):
    return {"id": id, "cluster": cluster, "node": node, "gpu": gpu, "uuid": None, "cause": cause, "severity": severity,
            "onset": onset, "detected_at": onset, "resolved_at": resolved, "evidence": evidence or {}, "summary": f"{cause} on {node}/{gpu}"}


def test_node_level_problems_fold_into_every_gpu_of_the_node():
    nodes = [KnownNode("prod", "a", tuple((i, f"U{i}") for i in range(4))), KnownNode("prod", "b", ((0, "V0"),))]
    eps = [
        episode("a", None, "network", "warning", 100, evidence={"metric": "bps", "bps": 1.2e10, "peer_bps": 2e10}, id=1),
        episode("a", 2, "thermal", "warning", 50, evidence={"clock_deviation": -0.15}, id=2),
    ]
    doc = compute_hints(eps, nodes, {"prod": 200.0}, HintSettings(), generated_at=1.0)
    a, b = doc["nodes"]
    assert (a["node"], a["action"], a["capacity"], a["since"]) == ("a", "avoid", 0.85, 50)
    assert [(g["index"], g["uuid"], g["action"], g["capacity"]) for g in a["gpus"]] == [
        (0, "U0", "avoid", 0.857), (1, "U1", "avoid", 0.857), (2, "U2", "avoid", 0.85), (3, "U3", "avoid", 0.857)]
    assert [(r["episode"], r["gpu"], r["action"]) for r in a["reasons"]] == [(1, None, "avoid"), (2, 2, "rebalance")]
    assert (b["action"], b["capacity"], b["since"], b["reasons"], b["gpus"][0]["action"]) == ("ok", 1.0, None, [], "ok")
    assert doc["generated_at"] == 1.0 and doc["sample_time"] == {"prod": 200.0}


def test_node_takes_the_worst_gpu_and_the_lowest_capacity():
    nodes = [KnownNode("prod", "a", tuple((i, None) for i in range(3)))]
    eps = [episode("a", 0, "clock", "warning", 10, evidence={"clock_deviation": -0.1}, id=1),
           episode("a", 1, "xid", "critical", 20, id=2),
           episode("a", 2, "thermal", "critical", 5, evidence={"clock_deviation": -0.4}, id=3)]
    node = compute_hints(eps, nodes, {"prod": 30.0}, HintSettings(), generated_at=0)["nodes"][0]
    assert (node["action"], node["capacity"], node["since"]) == ("drain", 0.0, 5)
    assert [(g["action"], g["capacity"]) for g in node["gpus"]] == [("rebalance", 0.9), ("drain", 0.0), ("avoid", 0.6)]
    assert [r["cause"] for r in node["reasons"]] == ["xid", "thermal", "clock"]  # gravest first


def test_each_cluster_cools_down_on_its_own_sample_clock():
    nodes = [KnownNode("east", "a", ((0, None),)), KnownNode("west", "a", ((0, None),))]
    eps = [episode("a", 0, "thermal", "warning", 800, cluster=c, resolved=900, id=i) for i, c in enumerate(("east", "west"))]
    doc = compute_hints(eps, nodes, {"east": 1000.0, "west": 5000.0}, HintSettings(cooldown_s=200), generated_at=0)
    assert [(n["cluster"], n["action"]) for n in doc["nodes"]] == [("east", "rebalance"), ("west", "ok")]


def test_gpus_and_nodes_known_only_from_episodes_are_listed():
    eps = [episode("ghost", 5, "lost", "critical", 10, cluster="c2")]
    doc = compute_hints(eps, [], {}, HintSettings(), generated_at=0)  # no clock: the newest episode time stands in
    assert [(n["cluster"], n["node"], n["action"], [(g["index"], g["action"]) for g in n["gpus"]]) for n in doc["nodes"]] == [
        ("c2", "ghost", "drain", [(5, "drain")])]
