"""What a refused agent logs: the hint built from a 401/403 body and the token's binding, and
a lasting problem logged once, again when it changes or rarely while it lasts, and when it ends."""

from __future__ import annotations

import logging

import pytest

from agent.refusal import ProblemLog, Refusal, hint, needs_binding, refusal_of


def body(loc, msg):
    return {"detail": [{"loc": loc, "msg": msg, "type": "forbidden"}]}


CLUSTER_403 = body(["body", "cluster"], "this token may push for cluster 'prod-a' only, not 'default'")
NODE_403 = body(["body", "node"], "this token may not push for node 'n9'")
SCOPE_403 = body(["header", "authorization"], "this token lacks the scope agent")


@pytest.mark.parametrize(("status", "reply", "binding", "token_sent", "cluster", "expected"), [
    (403, CLUSTER_403, {"cluster": "prod-a", "nodes": None}, True, "default",
     "token is bound to cluster prod-a; run with --cluster prod-a"),
    (403, CLUSTER_403, None, True, "default", "the token is not for cluster default; run with the --cluster the token was made for"),
    (403, NODE_403, {"cluster": "prod-a", "nodes": ["n1"]}, True, "prod-a", "token is bound to node n1; run with --node n1"),
    (403, NODE_403, {"cluster": "prod-a", "nodes": ["n1", "n2"]}, True, "prod-a",
     "token is bound to nodes n1, n2, not n9; use a token made for node n9 (laggard token create --scope agent --cluster prod-a --node n9)"),
    (403, NODE_403, None, True, "prod-a", "the token may not push for node n9"),
    (403, SCOPE_403, None, True, "prod-a",
     "the token lacks the agent scope: make an agent token (laggard token create --scope agent --cluster prod-a)"),
    (403, {"detail": "Forbidden"}, None, True, "prod-a", "the collector refuses this agent's pushes"),
    (401, body(["header", "authorization"], "unknown or revoked token"), None, True, None,
     "the token is missing, unknown or revoked: make an agent token (laggard token create --scope agent --cluster CLUSTER)"),
    (409, body(["body", "samples", "gpus", "uuid"], "GPU GPU-1 is on node 'n1' of cluster 'prod-a', also claimed by node 'n9'"),
     None, True, "prod-a", "another node reports a GPU UUID of this node (see the collector's message): check that --node n9"),
    (401, "<html>proxy says no</html>", None, False, "prod-a",
     "the collector needs a token: pass --token or --token-file (LAGGARD_TOKEN, LAGGARD_TOKEN_FILE)"),
])
def test_hint_names_the_fix(status, reply, binding, token_sent, cluster, expected):
    assert expected in hint(refusal_of(status, reply), binding, token_sent=token_sent, cluster=cluster, node="n9")


@pytest.mark.parametrize(("status", "reply", "expected"), [
    (403, CLUSTER_403, Refusal(403, ("body", "cluster"), CLUSTER_403["detail"][0]["msg"])),
    (403, {"detail": [{"loc": "body", "msg": 3}]}, Refusal(403, (), "3")),
    (401, {"detail": "Unauthorized"}, Refusal(401, (), "Unauthorized")),
    (403, "plain text", Refusal(403, (), "plain text")),
    (403, {}, Refusal(403, (), "")),
])
def test_refusal_of_any_body(status, reply, expected):
    assert refusal_of(status, reply) == expected


def test_only_cluster_and_node_refusals_ask_what_the_token_is_bound_to():
    assert [needs_binding(refusal_of(403, b)) for b in (CLUSTER_403, NODE_403, SCOPE_403)] == [True, True, False]
    assert not needs_binding(refusal_of(401, CLUSTER_403))


def test_a_lasting_problem_is_logged_once_then_rarely_again_when_it_changes_and_when_it_ends(caplog):
    now = [0.0]
    problems = ProblemLog(logging.getLogger("test.refusal"), every=3600, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="test.refusal")
    for _ in range(120):  # an agent retrying every 30 s for almost an hour
        problems.failing("403 cluster", "refused: cluster")
        now[0] += 30
    problems.failing("403 cluster", "refused: cluster")  # an hour on: once more
    problems.failing("401 token", "refused: token")  # a different answer
    problems.recovered("accepted again")
    problems.recovered("accepted again")
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]
    assert logged == [("ERROR", "refused: cluster"), ("ERROR", "refused: cluster (still)"), ("ERROR", "refused: token"),
                      ("INFO", "accepted again")]
