"""The views as HTML: fleet, one straggler episode, one node; the login and error pages.
Each takes its view model (server/ui/views.py) and returns the body for html.page()."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from server.ui import chart as svg
from server.ui.html import Links, a, badge, e, stamp, table
from server.ui.views import CAUSE_ABBREV, Cell, NodeRow, flatten, show, timeline

LEGEND = (("c-ok", "at its peers' clock"), ("c-dev1", "2–4% below"), ("c-dev2", "4–8% below"), ("c-dev3", "over 8% below, not flagged"),
          ("c-warning", "flagged: warning"), ("c-critical", "flagged: critical"), ("c-idle", "idle (not judged)"),
          ("c-lost", "lost"), ("c-nodata", "no recent sample"))


# --- fleet ----------------------------------------------------------------------------------


def fleet(vm: Mapping[str, Any], links: Links) -> str:
    parts = ["<h1>Fleet</h1>", _summary(vm), '<section class="grid-section">']
    for c in vm["clusters"]:
        parts.append(_cluster(c, links))
    if not vm["clusters"]:
        where = f' in cluster {e(vm["cluster"])}' if vm.get("cluster") else ""
        parts.append(f'<p class="empty">No node has reported{where} yet. Agents push to <code>/api/v1/samples</code>.</p>')
    parts.append(_legend() + "</section>")
    parts.append('<section><h2>Active stragglers</h2>' + episode_table(vm["episodes"], links) + "</section>")
    return "".join(parts)


def _summary(vm: Mapping[str, Any]) -> str:
    eps = vm["episodes"]
    crit = sum(1 for x in eps if x["severity"] == "critical")
    cards = [f'<div class="card"><div class="big">{len(eps)}</div>active stragglers'
             f'<div class="small">{crit} critical · {len(eps) - crit} warning</div></div>']
    cap = vm["capacity"]
    if cap is None:
        cards.append('<div class="card"><div class="big">?</div>capacity lost<div class="small">hints unavailable</div></div>')
    else:
        acts = " · ".join(f"{n} {act}" for act, n in cap["actions"].items())
        cards.append(f'<div class="card" id="capacity"><div class="big">{cap["fraction"]:.1%}</div>capacity lost'
                     f'<div class="small">{cap["lost"]:.2f} of {cap["gpus"]} GPUs · nodes: {e(acts)}</div></div>')
    counts = table(["cause", "critical", "warning", "total"],
                   ([f'{badge(CAUSE_ABBREV.get(r["cause"], "?"), "cause")} {e(r["cause"])}', e(r["critical"]), e(r["warning"]), e(r["total"])]
                    for r in vm["counts"]), css="counts", empty="no active episodes")
    cards.append(f'<div class="card wide"><div class="small">active episodes by cause and severity</div>{counts}</div>')
    return f'<section class="cards">{"".join(cards)}</section>'


def _cluster(c: Mapping[str, Any], links: Links) -> str:
    head = (f'<h2>cluster {a(links.fleet(c["name"]), c["name"])} <span class="small">{len(c["nodes"])} nodes · {c["gpus"]} GPUs · '
            f'{c["flagged"]} flagged · {c["idle"]} idle · {c["unseen"]} unseen · newest sample {stamp(c["now"])}</span></h2>')
    rows = "".join(_node_row(n, links) for n in c["nodes"])
    return f'<div class="cluster" data-cluster="{e(c["name"])}">{head}<div class="nodes">{rows}</div></div>'


def _node_row(n: NodeRow, links: Links) -> str:
    extra = "".join(a(links.episode(x["id"]), f'{x["cause"]} {x["severity"]}', class_=f'badge b-{x["severity"]}', title=x.get("summary"))
                    for x in n.node_episodes)
    stale = badge("stale", "stale") if n.stale else ""
    action = badge(f"{n.action} {n.capacity:.2f}", n.action) if n.action != "ok" else ""
    cells = "".join(_cell(c, links) for c in n.cells) or '<span class="small">no GPUs</span>'
    return (f'<div class="node-row" data-node="{e(n.node)}"><div class="node-name">{a(links.node(n.cluster, n.node), n.node)} '
            f'{action}{stale}{extra}</div><div class="gpus">{cells}</div></div>')


def _cell(c: Cell, links: Links) -> str:
    href = links.episode(c.episode["id"]) if c.episode else links.node(c.cluster, c.node) + f"#gpu-{c.index}"
    cause = c.episode["cause"] if c.episode else None
    dev = f"{c.deviation:.4f}" if c.deviation is not None else None
    label = f"{c.index}<b>{e(c.label)}</b>" if c.label else f"{c.index}"
    attrs = {"data-node": c.node, "data-gpu": c.index, "data-state": c.state, "data-cause": cause, "data-deviation": dev,
             "data-action": c.action, "title": c.title}
    rendered = "".join(f' {k}="{e(v)}"' for k, v in attrs.items() if v is not None)
    return f'<a class="gpu {e(c.css)} a-{e(c.action)}" href="{e(href)}"{rendered}>{label}</a>'


def _legend() -> str:
    items = "".join(f'<span class="key"><span class="gpu {css}"></span>{e(text)}</span>' for css, text in LEGEND)
    outline = '<span class="key"><span class="gpu c-ok a-avoid"></span>outlined: hint avoid / drain</span>'
    return f'<div class="legend">{items}{outline}<span class="key">letters: {e(" ".join(f"{v}={k}" for k, v in CAUSE_ABBREV.items()))}</span></div>'


def episode_table(eps: Sequence[Mapping[str, Any]], links: Links) -> str:
    rows = ([a(links.episode(x["id"]), f'#{x["id"]}'), badge(x["severity"], x["severity"]), e(x["cause"]), e(x["cluster"]),
             a(links.node(x["cluster"], x["node"]), x["node"]), e("node" if x.get("gpu") is None else x["gpu"]), stamp(x["onset"]),
             e(x.get("summary"))] for x in eps)
    return table(["episode", "severity", "cause", "cluster", "node", "GPU", "since", "summary"], rows, css="episodes",
                 empty="No active stragglers.")


# --- one episode ----------------------------------------------------------------------------


def episode(vm: Mapping[str, Any], links: Links) -> str:
    ep = vm["episode"]
    where = f'{ep["node"]} GPU {ep["gpu"]}' if ep.get("gpu") is not None else ep["node"]
    state = badge("resolved", "ok") if ep.get("resolved_at") is not None else badge("active", ep["severity"])
    charts = "".join(f'<figure class="chart-box">{svg.render(c)}{"".join(f"<figcaption>{e(n)}</figcaption>" for n in c.notes)}</figure>'
                     for c in vm["charts"])
    if not charts:
        charts = f'<p class="empty">{e(vm.get("no_chart") or "nothing to chart")}</p>'
    tl = table(["", "when", "clock"], ([e(what), stamp(ts, vm["now"]), e(clock)] for what, ts, clock in timeline(ep, vm["events"])),
               css="timeline")
    facts = [("cluster", a(links.fleet(ep["cluster"]), ep["cluster"])), ("node", a(links.node(ep["cluster"], ep["node"]), ep["node"])),
             ("GPU", e("— (node-level)" if ep.get("gpu") is None else ep["gpu"])), ("uuid", e(ep.get("uuid") or "—")),
             ("peer group", e(vm.get("peer_group") or "—")), ("peers charted", e(vm.get("peer_count", 0)))]
    facts += [(k, e(v)) for k, v in sorted((vm.get("labels") or {}).items())]
    facts += [(k, e(show(v))) for k, v in (vm.get("workload") or {}).items()]
    hint = vm.get("hint")
    if hint is not None:
        facts.append(("node hint", f'{badge(hint["action"], hint["action"])} capacity {hint["capacity"]:.2f} · '
                                   f'{a(links.node(ep["cluster"], ep["node"]), "what the schedulers are told")}'))
    json_link = a(links.api("/api/v1/stragglers", {"cluster": ep["cluster"], "node": ep["node"]}), "JSON")
    return (f'<h1 data-episode="{e(ep["id"])}">#{e(ep["id"])} {e(ep["cause"])} {badge(ep["severity"], ep["severity"])} {state}'
            f' <span class="where">{e(where)}</span></h1>'
            f'<p class="summary">{e(ep.get("summary"))}</p>'
            f'<section class="charts">{charts}</section>'
            f'<div class="columns"><section><h2>Timeline</h2>{tl}</section>'
            f'<section><h2>Where</h2>{table(["", ""], ([e(k), v] for k, v in facts), css="facts")}</section></div>'
            f'<section><h2>Evidence</h2>{table(["field", "value"], ([e(k), e(v)] for k, v in flatten(ep.get("evidence"))), css="evidence")}'
            f'<p class="small">{json_link}</p></section>')


# --- one node -------------------------------------------------------------------------------


def node(vm: Mapping[str, Any], links: Links) -> str:
    n, hint = vm["node"], vm.get("hint")
    labels = ", ".join(f"{k}={v}" for k, v in sorted(n["labels"].items())) or "none"
    head = (f'<h1>{e(n["node"])} <span class="where">cluster {a(links.fleet(n["cluster"]), n["cluster"])}</span></h1>'
            f'<p class="small">labels: {e(labels)} · last sample {stamp(n["last_seen"], vm["now"])}</p>')
    return head + _hint(hint, vm, links) + _gpus(vm["gpus"], vm["now"]) + _nics(vm["nics"], vm["now"]) + (
        f'<section><h2>Episodes (open, and resolved in the last day)</h2>{episode_table(vm["episodes"], links)}</section>')


def _hint(hint: Mapping[str, Any] | None, vm: Mapping[str, Any], links: Links) -> str:
    if hint is None:
        return '<section class="hint"><h2>Hint</h2><p class="empty">hints unavailable</p></section>'
    reasons = table(["episode", "GPU", "cause", "severity", "action", "capacity", "why", "until"],
                    ([a(links.episode(r["episode"]), f'#{r["episode"]}') if r.get("episode") else "—", e(show(r.get("gpu"))), e(r["cause"]),
                      e(r["severity"]), badge(r["action"], r["action"]), e(f'{r["capacity"]:.2f}'),
                      e(r.get("summary")) + (f' <span class="small">({e(r["escalated"])})</span>' if r.get("escalated") else ""),
                      _until(r)] for r in hint.get("reasons") or []), css="reasons", empty="no reason: the node is fine")
    k8s = vm["kubernetes"]
    return (f'<section class="hint"><h2>Hint: {badge(hint["action"], hint["action"])} capacity {hint["capacity"]:.2f}</h2>'
            f'<p class="small">since {stamp(hint.get("since"), vm["now"])}</p>{reasons}'
            f'<dl class="sched"><dt>Slurm (laggard slurm-sync)</dt><dd><code>{e(vm["slurm"])}</code></dd>'
            f'<dt>Kubernetes taint (laggard k8s-sync)</dt><dd><code>{e(k8s["taint"] or "none")}</code></dd>'
            f'<dt>Kubernetes condition</dt><dd><code>{e(k8s["condition"] or "unchanged")}</code></dd></dl></section>')


def _until(r: Mapping[str, Any]) -> str:
    if r.get("held"):
        held = r["held"]
        return e(f"held until {held.get('remedy', 'a remedy')}" if isinstance(held, Mapping) else "held until remedied")
    if r.get("clears_at") is not None:
        return "clears " + stamp(r["clears_at"])
    return "while active"


def _gpus(gpus: Sequence[Mapping[str, Any]], now: float | None) -> str:
    rows = []
    for g in gpus:
        s = g["sample"]
        clock = f'{show(s.get("sm_clock_mhz"))} / {show(s.get("sm_clock_max_mhz"))}' if s else "—"
        power = f'{show(s.get("power_w"))} / {show(s.get("power_limit_w"))}' if s else "—"
        links_up = f'{show(s.get("nvlink_links_up"))} / {show(s.get("nvlink_links_total"))}' if s else "—"
        pcie = f'gen {show(s.get("pcie_gen"))} x{show(s.get("pcie_width"))}' if s else "—"
        state = "lost" if s.get("lost") else ("busy" if g["busy"] else "idle") if s else "no sample"
        rows.append([f'<span id="gpu-{e(g["index"])}">{e(g["index"])}</span>', e(g.get("model")), badge(g["action"], g["action"]),
                     e(f'{g["capacity"]:.2f}'), e(state), e(clock), e(show(s.get("util_gpu_pct")) if s else "—"),
                     e(show(s.get("temp_c")) if s else "—"), e(power), e(links_up), e(pcie), e(", ".join(g["reasons"]) or "—"),
                     stamp(s.get("ts")) if s else "—"])
    return ('<section><h2>GPUs (latest sample)</h2>' + table(
        ["GPU", "model", "hint", "capacity", "state", "SM MHz / max", "util %", "°C", "W / limit", "NVLink up", "PCIe", "clock reasons",
         "sampled"], rows, css="gpus-table", empty="no GPUs") + "</section>")


def _nics(nics: Sequence[Mapping[str, Any]], now: float | None) -> str:
    rows = []
    for p in nics:
        s = p.get("latest") or {}
        rows.append([e(p["device"]), e(p["port"]), e(s.get("state") or "—"), e(show(s.get("rate_gbps"))), e(show(s.get("symbol_errors_total"))),
                     e(show(s.get("rcv_errors_total"))), e(show(s.get("link_downed_total"))), stamp(s.get("ts")) if s else "—"])
    return ('<section><h2>Network ports (latest sample)</h2>' + table(
        ["device", "port", "state", "Gb/s", "symbol errors", "receive errors", "link downed", "sampled"], rows, css="nics-table",
        empty="no ports") + "</section>")


# --- login and errors -----------------------------------------------------------------------


def login(links: Links, *, next_url: str | None, error: str | None = None) -> str:
    err = f'<p class="error" role="alert">{e(error)}</p>' if error else ""
    hidden = f'<input type="hidden" name="next" value="{e(next_url)}">' if next_url else ""
    return (f'<h1>Sign in</h1>{err}<form method="post" action="{e(links.login())}" class="login">'
            '<label for="token">A token with the <code>read</code> scope (<code>laggard token create --scope read</code>)</label>'
            '<input id="token" name="token" type="password" autocomplete="off" required spellcheck="false">'
            f'{hidden}<button type="submit">Sign in</button></form>'
            '<p class="small">The token is kept in an HttpOnly cookie of this site until the browser closes or you sign out.</p>')


def message(title: str, text: str, links: Links, *, login_link: bool = False) -> str:
    extra = f'<p>{a(links.login(), "Sign in with another token")}</p>' if login_link else ""
    return f'<h1>{e(title)}</h1><p class="message">{e(text)}</p>{extra}'
