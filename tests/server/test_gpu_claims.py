"""IdResolver's GPU claims at the store level: a GPU registered for another node by a concurrent
writer, between this batch's claim check and its insert, fails the batch's transaction instead
of moving the GPU (the HTTP behaviour is in tests/auth/test_gpu_identity.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from server.store import schema
from server.store.ids import Claimant, GpuClaimConflict, IdCache, IdResolver

T0 = 1_790_000_000.0


@pytest.fixture
def engine(migrated_engine):
    return migrated_engine


def test_a_gpu_registered_meanwhile_for_another_node_is_a_conflict_not_a_move(engine):
    cache = IdCache()
    with engine.begin() as other:  # the concurrent writer: node "a" registers the GPU and commits
        theirs = IdResolver(other, cache)
        a = theirs.node_id(cluster="c", name="a", seen=T0)
    with pytest.raises(GpuClaimConflict, match="'a'.*'b'|'b'.*'a'"):
        with engine.begin() as conn:
            mine = IdResolver(conn, IdCache())
            mine.refuse_conflicting_claims(Claimant("c", "b"), [("GPU-1", 0, None, None, T0)])  # not known yet
            with engine.begin() as other:
                IdResolver(other, cache).gpu_id(node_id=a, uuid="GPU-1", index=0, model=None, pci_bus_id=None, seen=T0)
            b = mine.node_id(cluster="c", name="b", seen=T0)
            mine.gpu_id(node_id=b, uuid="GPU-1", index=0, model=None, pci_bus_id=None, seen=T0)
    with engine.connect() as conn:
        holder = conn.execute(select(schema.Node.name).join(schema.Gpu, schema.Gpu.node_id == schema.Node.id)
                              .where(schema.Gpu.uuid == "GPU-1")).scalar_one()
    assert holder == "a"
