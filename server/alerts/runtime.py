"""Wiring into the app's lifespan: the routing (checked before anything starts) and the dispatcher."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine

from server.alerts.dispatcher import AlertDispatcher, external_url_of
from server.alerts.routing import Routing, routing_from_settings
from server.alerts.settings import AlertSettings


def routing(cfg: AlertSettings) -> Routing:
    """Receivers and routes from the alerts section (webhook_urls, webhook_secret, routes_file);
    raises RoutingError on a bad routes file."""
    return routing_from_settings(cfg)


def external_url(settings) -> str:
    """Where alerts link back to: alerts.external_url, else this collector's host and port."""
    return external_url_of(settings)


def start(engine: Engine, routes: Routing, cfg: AlertSettings, *, external_url: str, is_leader: Callable[[], bool]) -> AlertDispatcher:
    """The dispatcher, running (when alerts are enabled) but acting only while is_leader()."""
    dispatcher = AlertDispatcher(engine, routes, cfg, external_url=external_url, is_leader=is_leader)
    if cfg.enabled:
        dispatcher.start()
    return dispatcher
