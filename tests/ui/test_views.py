"""The view models: the fleet grid's cells (flagged by their worst episode, idle apart from slow,
shaded by deviation from their peer group), counts by cause and severity, capacity lost; what a
node's hint tells Slurm and Kubernetes; evidence and timeline rows."""

from __future__ import annotations

from server.hints.settings import HintSettings
from server.ui import views
from server.ui.views import capacity_lost, deviation_class, episode_counts, flatten, fleet_view, kubernetes_says, slurm_says, timeline

T0 = 1_700_000_000.0


def gpu(node: str, index: int, *, clock: int | None = 1980, util: float = 98.0, reasons: int = 0, lost: bool = False, job: str = "llm",
        cluster: str = "c1", sample: bool = True) -> dict:
    s = {"ts": T0, "lost": lost, "sm_clock_mhz": clock, "sm_clock_max_mhz": 1980, "util_gpu_pct": util, "clocks_event_reasons": reasons,
         "temp_c": 65.0, "power_w": 600.0}
    return {"cluster": cluster, "node": node, "index": index, "uuid": f"GPU-{node}-{index}", "model": "H100", "labels": {"job": job},
            "sample": s if sample else None}


def node(name: str, *, last_seen: float = T0, cluster: str = "c1") -> dict:
    return {"cluster": cluster, "node": name, "labels": {"job": "llm"}, "last_seen": last_seen}


def episode(eid: int, node: str, gpu: int | None, cause: str, severity: str, **kw) -> dict:
    return {"id": eid, "cluster": "c1", "node": node, "gpu": gpu, "cause": cause, "severity": severity, "onset": T0 - 30, "detected_at": T0 - 29,
            "resolved_at": None, "summary": f"{cause} on {node}", "evidence": {}, **kw}


def cells(vm: dict) -> dict:
    return {(c.node, c.index): c for cl in vm["clusters"] for n in cl["nodes"] for c in n.cells}


def test_cells_flagged_idle_lost_stale_and_shaded_by_deviation():
    gpus = [gpu("n1", i) for i in range(6)]
    gpus += [gpu("n1", 6, clock=1880), gpu("n1", 7, clock=1700), gpu("n2", 0, clock=345, util=0.0, reasons=0x1), gpu("n2", 1, lost=True),
             gpu("n2", 2, sample=False), gpu("n3", 0)]
    eps = [episode(1, "n1", 7, "clock", "warning"), episode(2, "n1", 7, "thermal", "critical"), episode(3, "n2", None, "network", "critical")]
    vm = fleet_view([node("n1"), node("n2"), node("n3", last_seen=T0 - 300)], gpus, eps, None)
    c = cells(vm)
    assert (c[("n1", 7)].state, c[("n1", 7)].css, c[("n1", 7)].label) == ("flagged", "c-critical", "T")  # the worst of its two
    assert c[("n1", 7)].episode["id"] == 2
    assert (c[("n2", 0)].state, c[("n2", 0)].css) == ("idle", "c-idle")  # idle: its low clock is not slowness
    assert c[("n2", 0)].deviation is None
    assert (c[("n2", 1)].state, c[("n2", 1)].css) == ("lost", "c-lost")
    assert (c[("n2", 2)].state, c[("n2", 2)].css) == ("nodata", "c-nodata")
    assert c[("n3", 0)].state == "stale"
    assert (c[("n1", 6)].state, c[("n1", 6)].css) == ("ok", "c-dev2")  # 5 % below its peers' median, not flagged
    assert round(c[("n1", 6)].deviation, 3) == round(1880 / 1980 - 1, 3)
    assert c[("n1", 0)].css == "c-ok"
    rows = {n.node: n for n in vm["clusters"][0]["nodes"]}
    assert [e["id"] for e in rows["n2"].node_episodes] == [3] and rows["n3"].stale
    totals = vm["clusters"][0]
    assert (totals["gpus"], totals["flagged"], totals["idle"], totals["unseen"]) == (12, 1, 1, 3)


def test_peers_are_the_same_cluster_model_and_job():
    gpus = [gpu("a", i, job="slow-job", clock=1500) for i in range(4)] + [gpu("b", i, job="fast-job") for i in range(4)]
    c = cells(fleet_view([node("a"), node("b")], gpus, [], None))
    assert {x.css for x in c.values()} == {"c-ok"}  # a job running uniformly slower is not a straggler
    assert views.peer_medians([gpu("a", 0)]) == {}  # one GPU has no peers


def test_deviation_shades():
    assert [deviation_class(d, 0.08) for d in (None, 0.05, -0.01, -0.03, -0.05, -0.2)] == ["c-ok", "c-ok", "c-ok", "c-dev1", "c-dev2",
                                                                                           "c-dev3"]


def test_counts_by_cause_and_severity():
    eps = [episode(1, "n", 0, "thermal", "critical"), episode(2, "n", 1, "thermal", "warning"), episode(3, "n", 2, "clock", "warning"),
           episode(4, "n", 3, "thermal", "critical")]
    assert episode_counts(eps) == [{"cause": "thermal", "warning": 1, "critical": 2, "total": 3},
                                   {"cause": "clock", "warning": 1, "critical": 0, "total": 1}]
    assert [e["id"] for e in views.sorted_episodes(eps)] == [1, 4, 2, 3]


def test_capacity_lost_from_the_hints():
    doc = {"generated_at": T0, "nodes": [
        {"cluster": "c1", "node": "n1", "action": "avoid", "capacity": 0.5,
         "gpus": [{"index": 0, "action": "avoid", "capacity": 0.5}, {"index": 1, "action": "ok", "capacity": 1.0}]},
        {"cluster": "c1", "node": "n2", "action": "drain", "capacity": 0.0,
         "gpus": [{"index": 0, "action": "drain", "capacity": 0.0}, {"index": 1, "action": "drain", "capacity": 0.0}]},
    ]}
    cap = capacity_lost(doc)
    assert (cap["gpus"], cap["lost"], cap["fraction"]) == (4, 2.5, 0.625)
    assert cap["actions"] == {"ok": 0, "rebalance": 0, "avoid": 1, "drain": 1}
    assert capacity_lost(None) is None and capacity_lost({"nodes": []})["fraction"] == 0.0
    c = cells(fleet_view([node("n1")], [gpu("n1", 0), gpu("n1", 1)], [], doc))
    assert (c[("n1", 0)].action, c[("n1", 0)].capacity) == ("avoid", 0.5)


def hint(action: str, capacity: float, cause: str = "thermal") -> dict:
    reasons = [] if action == "ok" else [{"cause": cause, "summary": "GPU 3 at 91 °C — hot", "action": action, "capacity": capacity,
                                          "severity": "critical", "onset": T0, "episode": 1}]
    return {"cluster": "c1", "node": "n1", "action": action, "capacity": capacity, "reasons": reasons, "gpus": []}


def test_what_slurm_and_kubernetes_are_told():
    cfg = HintSettings()
    drain = slurm_says("n1", hint("drain", 0.0, "xid"), cfg)
    assert drain.startswith('scontrol update NodeName=n1 State=DRAIN Reason="laggard: xid: GPU 3 at 91 C - hot"')
    assert "Weight raised" in slurm_says("n1", hint("avoid", 0.5), cfg)
    assert slurm_says("n1", hint("ok", 1.0), cfg).startswith("nothing") and slurm_says("n1", None, cfg).startswith("nothing")
    k8s = kubernetes_says("n1", hint("drain", 0.0, "xid"), cfg)
    assert k8s["taint"] == "laggard.io/straggler=xid:NoSchedule"
    assert k8s["condition"].startswith("LaggardStraggler=True (Drain)")
    assert kubernetes_says("n1", hint("avoid", 0.5), cfg)["taint"] == "laggard.io/straggler=thermal:PreferNoSchedule"
    ok = kubernetes_says("n1", hint("ok", 1.0), cfg)
    assert ok["taint"] is None and ok["condition"].startswith("LaggardStraggler=False (NoStraggler)")


def test_evidence_rows_and_timeline():
    rows = dict(flatten({"metric": "sm_clock_mhz", "value": 975, "ok": True, "reasons": ["a", "b"], "window": {"from": T0, "to": None},
                         "peers": {"median": 0.98765}}))
    assert rows == {"metric": "sm_clock_mhz", "value": "975", "ok": "yes", "reasons": "a, b", "window.from": "2023-11-14 22:13:20Z",
                    "window.to": "—", "peers.median": "0.9877"}
    ep = episode(1, "n1", 0, "thermal", "warning", resolved_at=T0 + 100)
    events = [{"change": "opened", "at": T0}, {"change": "escalated", "at": T0 + 50, "episode": {"severity": "critical"}}]
    assert [w for w, _, _ in timeline(ep, events)] == ["onset", "detected", "escalated to critical", "resolved"]
    assert views.ago(T0, T0 + 30) == "30 s" and views.ago(T0, T0 + 600) == "10 min" and views.ago(None, T0) == ""
