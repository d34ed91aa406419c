"""Which slice of the fleet one scrape carries: GET /metrics?cluster=…&shard=i&shards=n.

A fleet of 100,000 GPUs is a scrape of about three million series; Prometheus splits a target
that large across scrape jobs (or servers). Each series has exactly one home, so the slices of
one split, scraped together, carry every series of the whole scrape once:

- a GPU's series (Laggard's and the DCGM ones, from its latest sample) live in the shard of the
  GPU's peer group (cluster, model, attributed job), so that the peer deviation's median is taken
  over the same GPUs in a slice as in the whole scrape;
- every other series that names a node (the node's own, its ports', its episodes', its XIDs')
  lives in the shard of its (cluster, node);
- a per-cluster series that names no node (nodes reporting, detection lag, counters by cluster)
  lives in shard 0 of its cluster;
- a series without a cluster label (build info, ingest latency, alert outbox, this replica's
  process_* series, laggard_fleet_exporter) lives in shard 0 of the cluster "" — as the PromQL
  matcher cluster="" selects series without the label.

`cluster` may be repeated (a job per group of clusters); no `cluster` means every cluster and the
series without one; no `shard`/`shards` means shard 0 of 1.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_SHARDS = 4096
PARAMETERS = ("cluster", "shard", "shards")


class SelectionError(ValueError):
    """A bad selection: `parameter` names the query parameter at fault."""

    def __init__(self, parameter: str, message: str):
        super().__init__(message)
        self.parameter = parameter


def shard_of(key: str, shards: int) -> int:
    """The shard of a home key: crc32, the same in every process and replica (unlike hash())."""
    return zlib.crc32(key.encode()) % shards if shards > 1 else 0


@dataclass(frozen=True)
class Selection:
    clusters: frozenset[str] | None = None  # None: every cluster, and the series without one
    shard: int = 0
    shards: int = 1

    @property
    def whole(self) -> bool:
        return self.clusters is None and self.shards == 1

    def takes_cluster(self, cluster: str) -> bool:
        return self.clusters is None or cluster in self.clusters

    def takes_node(self, cluster: str, node: str) -> bool:
        return self.takes_cluster(cluster) and shard_of(f"{cluster}\0{node}", self.shards) == self.shard

    def takes_peer_group(self, cluster: str, group: str) -> bool:
        """`group`: the GPU's peer group (server.peer_groups.peer_group, which starts with its cluster)."""
        return self.takes_cluster(cluster) and shard_of(group, self.shards) == self.shard

    def takes_cluster_level(self, cluster: str) -> bool:
        return self.shard == 0 and self.takes_cluster(cluster)

    @property
    def takes_unclustered(self) -> bool:
        return self.shard == 0 and self.takes_cluster("")

    def takes_labels(self, labels: Mapping[str, str]) -> bool:
        """The home of a series known by its labels only (the shared counters)."""
        cluster, node = labels.get("cluster"), labels.get("node")
        if cluster is None:
            return self.takes_unclustered
        return self.takes_cluster_level(cluster) if node is None else self.takes_node(cluster, node)


WHOLE = Selection()


def parse_selection(params: Sequence[tuple[str, str]]) -> Selection:
    """The selection in a query string's (name, value) pairs; SelectionError on a parameter that
    is unknown, repeated (but cluster), not a number, or out of range."""
    seen: dict[str, list[str]] = {}
    for name, value in params:
        if name not in PARAMETERS:
            raise SelectionError(name, f"unknown parameter {name!r}: /metrics takes {', '.join(PARAMETERS)}")
        seen.setdefault(name, []).append(value)
    for name in ("shard", "shards"):
        if len(seen.get(name, ())) > 1:
            raise SelectionError(name, f"{name} given {len(seen[name])} times")
    shards = _integer(seen, "shards", default=1, low=1, high=MAX_SHARDS)
    shard = _integer(seen, "shard", default=0, low=0, high=shards - 1)
    if ("shard" in seen) != ("shards" in seen):
        missing = "shards" if "shard" in seen else "shard"
        raise SelectionError(missing, "shard and shards go together (shard=i&shards=n, 0 <= i < n)")
    clusters = frozenset(seen["cluster"]) if "cluster" in seen else None
    return Selection(clusters, shard, shards)


def _integer(seen: dict[str, list[str]], name: str, *, default: int, low: int, high: int) -> int:
    if name not in seen:
        return default
    raw = seen[name][0]
    if not raw.isascii() or not raw.isdigit():
        raise SelectionError(name, f"{name} must be a whole number, not {raw!r}")
    value = int(raw)
    if not low <= value <= high:
        raise SelectionError(name, f"{name} must be between {low} and {high}, not {value}")
    return value
