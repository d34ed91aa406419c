"""`laggard token create|list|revoke`: API tokens, straight in the database (so the first admin
token can be made before anyone can authenticate). The new token is printed once, alone on
stdout; everything else goes to stderr."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from server.auth.tokens import SCOPES, parse_scopes

COLUMNS = ("KEY ID", "NAME", "SCOPES", "CLUSTER", "NODES", "CREATED", "REVOKED")


def add_parser(sub, database_flag) -> None:
    p = sub.add_parser("token", help="create, list and revoke API tokens (in the database)")
    actions = p.add_subparsers(dest="action", required=True)

    create = actions.add_parser("create", help="create a token and print it, once")
    create.add_argument("--scope", action="append", required=True, help=f"repeatable or comma-separated: {', '.join(SCOPES)}")
    create.add_argument("--cluster", help="agent tokens: the one cluster it may push for (required with --scope agent)")
    create.add_argument("--node", action="append", help="agent tokens: only for this node (repeatable; default: any node)")
    create.add_argument("--name", default="", help="what the token is for, shown by `laggard token list`")
    database_flag(create)
    create.set_defaults(run=_create)

    lister = actions.add_parser("list", help="list tokens (never their secrets)")
    lister.add_argument("-o", "--output", choices=["table", "json"], default="table")
    database_flag(lister)
    lister.set_defaults(run=_list)

    revoke = actions.add_parser("revoke", help="revoke a token by its key id (from `laggard token list`)")
    revoke.add_argument("key_id")
    database_flag(revoke)
    revoke.set_defaults(run=_revoke)


def _engine(args: argparse.Namespace):
    from server.store import migrate
    from server.store.engine import make_engine

    engine = make_engine(args.load_settings(args).database_url)
    migrate.upgrade(engine)
    return engine


def _create(args: argparse.Namespace) -> int:
    from server.auth.store import create_token

    try:
        scopes = parse_scopes(args.scope)
        engine = _engine(args)
        with engine.begin() as conn:
            token, info = create_token(conn, scopes=scopes, name=args.name, cluster=args.cluster, nodes=args.node)
    except ValueError as exc:
        print(f"laggard token create: {exc}", file=sys.stderr)
        return 2
    print(f"created token {info.key_id} (scopes {','.join(info.scopes)}"
          f"{'; cluster ' + info.cluster if info.cluster else ''}{'; nodes ' + ','.join(info.nodes) if info.nodes else ''}); "
          "it is shown once, here:", file=sys.stderr)
    print(token)
    return 0


def _list(args: argparse.Namespace) -> int:
    from server.auth.store import list_tokens

    with _engine(args).connect() as conn:
        tokens = list_tokens(conn)
    if args.output == "json":
        print(json.dumps({"tokens": [vars(t) for t in tokens]}, indent=2))
        return 0
    rows = [(t.key_id, t.name or "-", ",".join(t.scopes), t.cluster or "-", ",".join(t.nodes) if t.nodes else "-",
             _when(t.created_at), _when(t.revoked_at)) for t in tokens]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(COLUMNS)]
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip())
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from server.auth.store import revoke_token

    with _engine(args).begin() as conn:
        revoked = revoke_token(conn, key_id=args.key_id)
    if not revoked:
        print(f"laggard token revoke: no live token with key id {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}; collectors stop accepting it within LAGGARD_AUTH__TOKEN_CACHE_S (10 s)", file=sys.stderr)
    return 0


def _when(ts: float | None) -> str:
    return "-" if ts is None else dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
