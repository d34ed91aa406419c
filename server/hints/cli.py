"""`laggard hints`, `laggard k8s-sync`, `laggard slurm-sync`: the hints of a running collector,
printed or carried into Kubernetes and Slurm."""

from __future__ import annotations

import argparse
import json
import sys
import time

from server.collector_client import CollectorUnavailable, add_server_flags, call_collector
from server.hints.render import render_table


def add_parser(sub) -> None:
    p = sub.add_parser("hints", help="print the scheduler hints of a running collector")
    _common(p)
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.add_argument("--all", action="store_true", help="table: list ok nodes too")
    p.set_defaults(run=run_hints)

    k = sub.add_parser("k8s-sync", help="keep the laggard.io/straggler taint and node condition in step with the hints")
    _common(k)
    _acting(k)
    k.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)")
    k.add_argument("--context", help="kubeconfig context")
    k.add_argument("--kube-api", help="API server URL used without credentials, e.g. kubectl proxy's http://127.0.0.1:8001")
    k.add_argument("--selector", help="only nodes matching this label selector")
    k.set_defaults(run=run_k8s_sync)

    s = sub.add_parser("slurm-sync", help="drain Slurm nodes whose hint is drain and raise the Weight of avoid nodes; "
                       "resume and restore the ones it changed once healthy")
    _common(s)
    _acting(s)
    s.add_argument("--scontrol", help="scontrol executable (LAGGARD_HINTS__SCONTROL_PATH, default scontrol)")
    s.add_argument("--reason-prefix", help="start of the drain Reasons it writes and the only drains it resumes; must contain "
                   "'laggard' (LAGGARD_HINTS__SLURM_REASON_PREFIX, default 'laggard:'; 'NHC: laggard:' for the NHC convention)")
    s.set_defaults(run=run_slurm_sync)


def _common(p: argparse.ArgumentParser) -> None:
    add_server_flags(p)
    p.add_argument("--cluster", help="only this cluster's nodes")


def _acting(p: argparse.ArgumentParser) -> None:
    p.add_argument("--apply", action="store_true", help="make the changes (default: dry run, print them)")
    p.add_argument("--interval", type=float, default=None, help="repeat every this many seconds (default: once)")


def fetch_hints(server: str, cluster: str | None, token: str | None = None) -> dict:
    params = {"cluster": cluster} if cluster else {}
    return call_collector("GET", server, "/api/v1/hints", token=token, expect=200, timeout=30, params=params).json()


def run_hints(args: argparse.Namespace) -> int:
    try:
        doc = fetch_hints(args.server, args.cluster, args.token)
    except CollectorUnavailable as exc:
        print(f"laggard: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.output == "json" else render_table(doc, all_nodes=args.all))
    return 0


def _hint_settings(args: argparse.Namespace, **overrides):
    """The hints settings with the flags given laid over them, validated like the environment's."""
    cfg = args.load_settings(args).hints
    given = {k: v for k, v in overrides.items() if v is not None}
    return type(cfg).model_validate({**cfg.model_dump(), **given}) if given else cfg


def _loop(args: argparse.Namespace, once) -> int:
    """Run `once(doc)` now, and every --interval seconds if given. Hints that cannot be had
    change nothing: a sync never acts on missing data."""
    while True:
        try:
            once(fetch_hints(args.server, args.cluster, args.token))
            status = 0
        except CollectorUnavailable as exc:
            print(f"laggard: {exc}; nothing changed", file=sys.stderr)
            status = 1
        except Exception as exc:  # one failed round (API server, scontrol) must not end a loop
            print(f"laggard: {exc}", file=sys.stderr)
            status = 1
        if args.interval is None:
            return status
        sys.stdout.flush()
        time.sleep(args.interval)


def run_k8s_sync(args: argparse.Namespace) -> int:
    from server.hints import k8s_sync

    cfg = _hint_settings(args)
    try:
        api = k8s_sync.make_api(kube_api=args.kube_api, kubeconfig=args.kubeconfig, context=args.context)
    except k8s_sync.NoCluster as exc:
        print(f"laggard k8s-sync: {exc}", file=sys.stderr)
        return 2
    return _loop(args, lambda doc: k8s_sync.sync_once(api, doc, cfg, apply=args.apply, selector=args.selector))


def run_slurm_sync(args: argparse.Namespace) -> int:
    from server.hints import slurm_sync

    # An invalid flag (a prefix without 'laggard') raises ValidationError: main() reports it.
    cfg = _hint_settings(args, scontrol_path=args.scontrol, slurm_reason_prefix=args.reason_prefix)
    return _loop(args, lambda doc: slurm_sync.sync_once(doc, cfg, apply=args.apply))
