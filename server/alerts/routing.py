"""Who receives which alert.

Two sources, combined:
- LAGGARD_ALERTS__WEBHOOK_URLS (comma-separated) and LAGGARD_ALERTS__WEBHOOK_SECRET (or the flat
  LAGGARD_WEBHOOK_URLS and LAGGARD_WEBHOOK_SECRET): receivers named webhook-1, webhook-2, ... that
  get every alert;
- the routes file (LAGGARD_ALERTS__ROUTES_FILE, YAML or JSON), for routing by cluster, cause,
  severity or any other alert label:

    receivers:
      - name: gpu-oncall
        url: https://pager.example.com/hooks/laggard
        secret_env: ONCALL_HOOK_SECRET        # or secret_file: /run/secrets/..., or secret: ...
      - name: team-alertmanager
        type: alertmanager                    # POST /api/v2/alerts instead of a webhook
        url: http://alertmanager:9093
    routes:                                   # first match wins, unless `continue: true`
      - match: {cluster: prod, severity: critical}
        receivers: [gpu-oncall, team-alertmanager]
      - match: {cause: [network, nvlink]}     # a list: any of these values
        match_re: {node: "ib-.*"}             # regular expressions, matched in full
        receivers: [team-alertmanager]
    default_receivers: [team-alertmanager]    # when no route matched

A receiver without its own secret signs with LAGGARD_WEBHOOK_SECRET (if set). Secrets and
headers never appear in repr() or in logs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from server.alerts.settings import AlertSettings


@dataclass(frozen=True)
class Receiver:
    name: str
    url: str = field(repr=False)
    type: Literal["webhook", "alertmanager"] = "webhook"
    secret: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float | None = None

    @property
    def safe_url(self) -> str:
        """scheme://host[:port] only: paths and queries of webhook URLs often hold tokens."""
        parts = urlsplit(self.url)
        host = parts.hostname or "?"
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


@dataclass(frozen=True)
class Route:
    receivers: tuple[str, ...]
    match: Mapping[str, frozenset[str]] = field(default_factory=dict)
    match_re: Mapping[str, re.Pattern] = field(default_factory=dict)
    continue_: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (all(labels.get(k, "") in allowed for k, allowed in self.match.items())
                and all(p.fullmatch(labels.get(k, "")) for k, p in self.match_re.items()))


@dataclass(frozen=True)
class Routing:
    receivers: Mapping[str, Receiver] = field(default_factory=dict)
    routes: tuple[Route, ...] = ()
    default: tuple[str, ...] = ()
    everywhere: tuple[str, ...] = ()  # LAGGARD_WEBHOOK_URLS receivers

    def receivers_for(self, labels: Mapping[str, str]) -> list[Receiver]:
        names: list[str] = list(self.everywhere)
        matched = False
        for route in self.routes:
            if route.matches(labels):
                matched = True
                names += route.receivers
                if not route.continue_:
                    break
        if not matched:
            names += self.default
        return [self.receivers[n] for n in dict.fromkeys(names)]

    def names(self) -> list[str]:
        return sorted(self.receivers)

    def alertmanagers(self) -> list[Receiver]:
        return [r for r in self.receivers.values() if r.type == "alertmanager"]


# --- the routes file -----------------------------------------------------------------------------


class _ReceiverDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    type: Literal["webhook", "alertmanager"] = "webhook"
    url: str
    secret: SecretStr | None = None
    secret_env: str | None = None
    secret_file: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    timeout_s: float | None = Field(None, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ValueError("expected an http:// or https:// URL")
        return url

    @model_validator(mode="after")
    def _one_secret(self) -> "_ReceiverDoc":
        if sum(x is not None for x in (self.secret, self.secret_env, self.secret_file)) > 1:
            raise ValueError("give at most one of secret, secret_env, secret_file")
        return self


class _RouteDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    match: dict[str, str | list[str]] = Field(default_factory=dict)
    match_re: dict[str, str] = Field(default_factory=dict)
    receivers: list[str] = Field(min_length=1)
    continue_: bool = Field(False, alias="continue")


class _RoutingDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    receivers: list[_ReceiverDoc] = Field(default_factory=list)
    routes: list[_RouteDoc] = Field(default_factory=list)
    default_receivers: list[str] = Field(default_factory=list)


class RoutingError(ValueError):
    pass


def load_routing(*, webhook_urls: str = "", webhook_secret: str | None = None, routes_file: str | None = None,
                 environ: Mapping[str, str] | None = None) -> Routing:
    """Receivers and routes from the settings (LAGGARD_WEBHOOK_URLS, LAGGARD_WEBHOOK_SECRET,
    LAGGARD_ALERTS__ROUTES_FILE). Raises RoutingError naming the problem (never a secret)."""
    env = os.environ if environ is None else environ
    receivers = _webhook_receivers(webhook_urls, webhook_secret)
    everywhere = list(receivers)
    routes: list[Route] = []
    default: list[str] = []
    if routes_file:
        parsed = _parse_routes_file(routes_file)
        receivers.update(_file_receivers(parsed, receivers, env, webhook_secret, routes_file))
        routes = [_route(r, i, receivers, routes_file) for i, r in enumerate(parsed.routes)]
        _check_known(parsed.default_receivers, receivers, f"{routes_file}: default_receivers")
        default = parsed.default_receivers
    return Routing(receivers=receivers, routes=tuple(routes), default=tuple(default), everywhere=tuple(everywhere))


def _webhook_receivers(webhook_urls: str, webhook_secret: str | None) -> dict[str, Receiver]:
    """LAGGARD_WEBHOOK_URLS as receivers webhook-1, webhook-2, ..., in that order."""
    receivers: dict[str, Receiver] = {}
    for i, url in enumerate((u.strip() for u in webhook_urls.split(",") if u.strip()), start=1):
        try:
            _ReceiverDoc._http(url)
        except ValueError:
            raise RoutingError(f"LAGGARD_WEBHOOK_URLS item {i}: expected an http:// or https:// URL") from None
        name = f"webhook-{i}"
        receivers[name] = Receiver(name=name, url=url, secret=webhook_secret)
    return receivers


def _parse_routes_file(routes_file: str) -> _RoutingDoc:
    doc = _read_doc(routes_file)
    try:
        return _RoutingDoc.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False))
        raise RoutingError(f"{routes_file}: {problems}") from None


def _file_receivers(parsed: _RoutingDoc, webhook_receivers: Mapping[str, Receiver], env: Mapping[str, str],
                    webhook_secret: str | None, routes_file: str) -> dict[str, Receiver]:
    """The routes file's receivers; a name may not repeat one of them or a webhook-N."""
    receivers: dict[str, Receiver] = {}
    for r in parsed.receivers:
        if r.name in receivers or r.name in webhook_receivers:
            raise RoutingError(f"{routes_file}: receiver name {r.name!r} used twice")
        receivers[r.name] = Receiver(
            name=r.name, url=r.url, type=r.type, secret=_secret(r, env, routes_file) or webhook_secret,
            headers={k: v.get_secret_value() for k, v in r.headers.items()}, timeout_s=r.timeout_s,
        )
    return receivers


def _route(r: _RouteDoc, i: int, receivers: Mapping[str, Receiver], routes_file: str) -> Route:
    _check_known(r.receivers, receivers, f"{routes_file}: routes.{i}")
    try:
        match_re = {k: re.compile(v) for k, v in r.match_re.items()}
    except re.error as exc:
        raise RoutingError(f"{routes_file}: routes.{i}.match_re: {exc}") from None
    match = {k: frozenset([v] if isinstance(v, str) else v) for k, v in r.match.items()}
    return Route(receivers=tuple(r.receivers), match=match, match_re=match_re, continue_=r.continue_)


def _check_known(names: list[str], receivers: Mapping[str, Receiver], where: str) -> None:
    for name in names:
        if name not in receivers:
            raise RoutingError(f"{where} names unknown receiver {name!r}")


def routing_from_settings(cfg: AlertSettings) -> Routing:
    """Receivers and routes of the alerts section: webhook_urls, webhook_secret and routes_file."""
    secret = cfg.webhook_secret.get_secret_value() if cfg.webhook_secret is not None else None
    return load_routing(webhook_urls=cfg.webhook_urls, webhook_secret=secret, routes_file=cfg.routes_file)


def _read_doc(path: str) -> Any:
    try:
        raw = Path(path).read_text()
    except OSError as exc:
        raise RoutingError(f"cannot read routes file {path}: {exc.strerror}") from None
    try:
        if path.endswith(".json"):
            return json.loads(raw)
        import yaml

        return yaml.safe_load(raw) or {}
    except Exception as exc:
        raise RoutingError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'}: {type(exc).__name__}") from None


def _secret(r: _ReceiverDoc, env: Mapping[str, str], path: str) -> str | None:
    if r.secret is not None:
        return r.secret.get_secret_value()
    if r.secret_env is not None:
        if r.secret_env not in env:
            raise RoutingError(f"{path}: receiver {r.name!r}: environment variable {r.secret_env} is not set")
        return env[r.secret_env]
    if r.secret_file is not None:
        try:
            return Path(r.secret_file).read_text().strip()
        except OSError as exc:
            raise RoutingError(f"{path}: receiver {r.name!r}: cannot read secret_file: {exc.strerror}") from None
    return None
