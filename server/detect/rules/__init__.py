"""The rules: pure functions (window, peer stats, settings) → Finding | None, one per file.

The engine runs every rule of a list on every instant. The lists are in precedence order, and
the rules are written so that one fault yields one cause without relying on that order:

GPU_RULES
  lost         the GPU reports lost; it alone speaks for a lost GPU (its XIDs in evidence)
  xid          a hardware XID (immediate); ECC-class XIDs with ECC evidence go to ecc
  ecc          new uncorrected errors (immediate) or rows pending remap
  thermal  ┐
  power    │   one shared triage (_perf.triage) picks at most one of these four:
  hw_slowdown  HW thermal > HW power brake > SW thermal > HW slowdown > power limit
  clock    ┘   below peers > clock low and hot > clock low with SW power cap > clock low
  nvlink       links down, errors rising, throughput below peers (not when the GPU is slowed)
  pcie         link below max gen (busy) or width, replays rising
NIC_RULES
  network      port not ACTIVE, rate below peers, errors rising or flaps, throughput/wait vs peers
"""

from __future__ import annotations

from server.detect.rules import clock, ecc, hw_slowdown, lost, network, nvlink, pcie, power, thermal, xid

GPU_RULES = [
    lost.evaluate,
    xid.evaluate,
    ecc.evaluate,
    thermal.evaluate,
    power.evaluate,
    hw_slowdown.evaluate,
    clock.evaluate,
    nvlink.evaluate,
    pcie.evaluate,
]
NIC_RULES = [network.evaluate]
