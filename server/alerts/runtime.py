"""Wiring into the app's lifespan: the routing (checked before anything starts) and the dispatcher."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from sqlalchemy import Engine

from server.alerts.dispatcher import AlertDispatcher, external_url_of
from server.alerts.routing import Routing, routing_from_settings


def routing(settings) -> Routing:
    """Receivers and routes from the settings; raises RoutingError on a bad routes file."""
    return routing_from_settings(settings)


def start(app: FastAPI, engine: Engine, routes: Routing, *, is_leader: Callable[[], bool]) -> AlertDispatcher:
    """The dispatcher, running (when alerts are enabled) but acting only while is_leader()."""
    settings = app.state.settings
    dispatcher = AlertDispatcher(engine, routes, settings.alerts, external_url=external_url_of(settings), is_leader=is_leader)
    if settings.alerts.enabled:
        dispatcher.start()
    app.state.alerts = dispatcher
    return dispatcher
