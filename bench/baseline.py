"""A plain fixed-threshold straggler detector: the comparison column of bench/detection.py.

What a team writes first, with no peers and no history beyond the previous sample:

  thermal      temperature > 85 °C, or a SW/HW thermal slowdown bit
  power        HW power brake bit (and, with count_power_cap, the SW power cap bit)
  hw_slowdown  HW slowdown bit with no more specific bit beside it
  clock        SM clock < 80% of max while utilisation > 50%, with no reason bit explaining it
  nvlink       fewer links up than the GPU has; any NVLink CRC/replay/recovery counter increase
  pcie         link generation or width below max while utilisation > 50%; any replay increase
  ecc          any ECC counter increase (corrected too), or remapped rows pending
  xid          any XID
  lost         the GPU reports lost, or is missing from its node's sample
  network      port not ACTIVE, rate below the fleet's 400 Gb/s, any symbol/receive-error or
               link-downed increase

An episode opens on the first sample that trips a rule and resolves after `clear_after`
consecutive clean samples; the output has the shape of the collector's episodes
(GET /api/v1/stragglers/history) so both are scored the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x4, 0x8, 0x20, 0x40, 0x80
_NVLINK_COUNTERS = ("nvlink_crc_errors_total", "nvlink_replay_errors_total", "nvlink_recovery_errors_total")
_ECC_COUNTERS = ("ecc_corrected_total", "ecc_uncorrected_total")
_NIC_COUNTERS = ("symbol_errors_total", "rcv_errors_total", "link_downed_total")


@dataclass
class BaselineSettings:
    temp_c: float = 85.0
    clock_frac: float = 0.8
    busy_util_pct: float = 50.0
    expected_rate_gbps: float = 400.0
    clear_after: int = 3
    count_power_cap: bool = False  # flag the routine SW power cap bit as well


class FixedThresholdDetector:
    def __init__(self, settings: BaselineSettings | None = None):
        self.s = settings or BaselineSettings()
        self.prev_gpu: dict[str, dict] = {}
        self.prev_nic: dict[tuple, dict] = {}
        self.node_gpus: dict[tuple[str, str], dict[str, int]] = {}  # (cluster, node) → uuid → index
        self.open: dict[tuple[str, str], dict[tuple, dict]] = {}  # (cluster, node) → (entity, cause) → episode
        self.clean: dict[tuple, int] = {}
        self.episodes: list[dict] = []

    # --- input -----------------------------------------------------------------------------

    def feed(self, cluster: str, node: str, sample: dict) -> None:
        """One node's sample; a node's samples must come in time order."""
        ts = sample["ts"]
        found: dict[tuple, tuple[str, str, int | None, str | None]] = {}  # (entity, cause) → (summary, node, gpu, uuid)
        known = self.node_gpus.setdefault((cluster, node), {})
        seen = set()
        for g in sample.get("gpus") or ():
            uuid = g["uuid"]
            seen.add(uuid)
            known[uuid] = g["index"]
            for cause, summary in self._gpu_findings(g, self.prev_gpu.get(uuid)):
                found.setdefault((("gpu", uuid), cause), (f"GPU {g['index']}: {summary}", node, g["index"], uuid))
            if not g.get("lost"):
                self.prev_gpu[uuid] = g
        for uuid, index in known.items():
            if uuid not in seen:
                found[(("gpu", uuid), "lost")] = (f"GPU {index}: missing from the node's sample", node, index, uuid)
        for n in sample.get("nics") or ():
            key = (cluster, node, n["device"], n["port"])
            for summary in self._nic_findings(n, self.prev_nic.get(key)):
                found.setdefault((("nic", key), "network"), (f"{n['device']} port {n['port']}: {summary}", node, None, None))
            self.prev_nic[key] = n
        self._step(cluster, node, ts, found)

    def finish(self) -> list[dict]:
        """Every episode so far (open ones with resolved_at None), in the collector's shape."""
        return list(self.episodes)

    # --- rules -----------------------------------------------------------------------------

    def _gpu_findings(self, g: dict, prev: dict | None):
        s = self.s
        if g.get("lost"):
            yield "lost", "reports lost"
            return
        bits = g.get("clocks_event_reasons") or 0
        yield from self._throttle_findings(g, bits)
        util = g.get("util_gpu_pct") or 0.0
        busy = util > s.busy_util_pct
        clock, cmax = g.get("sm_clock_mhz"), g.get("sm_clock_max_mhz")
        if busy and clock is not None and cmax and clock < s.clock_frac * cmax and not bits & ~(IDLE | SW_POWER_CAP):
            yield "clock", f"SM clock {clock} MHz < {s.clock_frac:.0%} of {cmax} at {util:.0f}% util"
        yield from self._link_findings(g, prev, busy)
        if _increased(g, prev, _ECC_COUNTERS) or g.get("remapped_rows_pending"):
            yield "ecc", "ECC counter increased or remapped rows pending"
        if g.get("xids"):
            yield "xid", "XID " + ", ".join(str(x["xid"]) for x in g["xids"])

    def _throttle_findings(self, g: dict, bits: int):
        """Temperature and the clock-event reason bits: thermal, power, hw_slowdown."""
        s = self.s
        temp = g.get("temp_c")
        if temp is not None and temp > s.temp_c:
            yield "thermal", f"temperature {temp:.0f} °C > {s.temp_c:.0f}"
        if bits & (SW_THERMAL | HW_THERMAL):
            yield "thermal", f"thermal slowdown bit (0x{bits:x})"
        if bits & HW_POWER_BRAKE:
            yield "power", f"HW power brake (0x{bits:x})"
        if s.count_power_cap and bits & SW_POWER_CAP:
            yield "power", f"SW power cap (0x{bits:x})"
        if bits & HW_SLOWDOWN and not bits & (HW_THERMAL | HW_POWER_BRAKE):
            yield "hw_slowdown", f"HW slowdown (0x{bits:x})"

    def _link_findings(self, g: dict, prev: dict | None, busy: bool):
        """The GPU's links: NVLink (links down, error counters) and PCIe (degraded link, replays)."""
        up, total = g.get("nvlink_links_up"), g.get("nvlink_links_total")
        if up is not None and total and up < total:
            yield "nvlink", f"{up}/{total} NVLinks up"
        if _increased(g, prev, _NVLINK_COUNTERS):
            yield "nvlink", "NVLink error counter increased"
        if busy and ((g.get("pcie_gen") or 0) < (g.get("pcie_gen_max") or 0) or (g.get("pcie_width") or 0) < (g.get("pcie_width_max") or 0)):
            yield "pcie", f"PCIe gen{g.get('pcie_gen')} x{g.get('pcie_width')} below max"
        if _increased(g, prev, ("pcie_replay_total",)):
            yield "pcie", "PCIe replay counter increased"

    def _nic_findings(self, n: dict, prev: dict | None):
        state = n.get("state")
        if state is not None and state != "ACTIVE":
            yield f"state {state}"
        rate = n.get("rate_gbps")
        if rate is not None and rate < self.s.expected_rate_gbps:
            yield f"rate {rate:.0f} Gb/s < {self.s.expected_rate_gbps:.0f}"
        if _increased(n, prev, _NIC_COUNTERS):
            yield "error counter increased"

    # --- episodes --------------------------------------------------------------------------

    def _step(self, cluster: str, node: str, ts: float, found: dict) -> None:
        open_here = self.open.setdefault((cluster, node), {})
        for key, (summary, node_name, gpu, uuid) in found.items():
            self.clean[key] = 0
            if key not in open_here:
                ep = {"id": f"b{len(self.episodes) + 1}", "cluster": cluster, "node": node_name, "gpu": gpu, "uuid": uuid,
                      "cause": key[1], "severity": "warning", "onset": ts, "detected_at": ts, "resolved_at": None,
                      "evidence": {"device": key[0][1][2]} if key[0][0] == "nic" else {}, "summary": summary}
                open_here[key] = ep
                self.episodes.append(ep)
        for key in [k for k in open_here if k not in found]:
            self.clean[key] = self.clean.get(key, 0) + 1
            if self.clean[key] >= self.s.clear_after:
                open_here.pop(key)["resolved_at"] = ts
                self.clean.pop(key)


def _increased(now: dict, prev: dict | None, keys) -> bool:
    if prev is None:
        return False
    for k in keys:
        a, b = prev.get(k), now.get(k)
        if a is not None and b is not None and b > a:
            return True
    return False
