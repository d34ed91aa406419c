"""Settings of alert delivery (LAGGARD_ALERTS__<NAME>). The simple receivers come from
LAGGARD_ALERTS__WEBHOOK_URLS and LAGGARD_ALERTS__WEBHOOK_SECRET (the flat LAGGARD_WEBHOOK_URLS and
LAGGARD_WEBHOOK_SECRET of earlier versions still set them: server/settings.py); routing by cluster,
cause and severity from the file named by LAGGARD_ALERTS__ROUTES_FILE (docs/observability.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class AlertSettings(BaseModel):
    enabled: bool = Field(True, description="Run the alert dispatcher (in the process that leads detection).")
    webhook_urls: str = Field("", description="Comma-separated webhook URLs that receive every alert (Alertmanager v4 payload).")
    webhook_secret: SecretStr | None = Field(None, description="HMAC-SHA256 key for the X-Laggard-Signature header.")
    routes_file: str | None = Field(None, description="YAML or JSON file of receivers and routes.")
    external_url: str | None = Field(
        None, description="This collector's URL as receivers should link to it (externalURL, generatorURL). "
                          "Default: http://<host>:<port>."
    )
    dashboard_url: str | None = Field(
        None, description="Grafana base URL; when set, generatorURL opens the straggler-detail dashboard on the GPU."
    )
    group_wait_s: float = Field(
        10.0, description="Alerts of one cluster and cause that open (or resolve) within this window go out as one notification."
    )
    min_firing_s: float = Field(
        60.0, description="An episode that opened and resolved before its firing alert went out (say during the startup "
                          "pass) is still sent firing first; its resolve follows this much later, so that a receiver, and "
                          "Alertmanager with its own group_wait (30 s by default), notifies the firing before the resolve."
    )
    poll_s: float = Field(0.5, description="How often the dispatcher looks for work.")
    timeout_s: float = Field(10.0, description="HTTP timeout of one delivery.")
    backoff_initial_s: float = Field(2.0, description="First retry delay; doubled on every failure (with jitter)...")
    backoff_max_s: float = Field(300.0, description="...up to this.")
    give_up_after_s: float = Field(86400.0, description="A delivery still failing this long after its alert is dropped (logged).")
    alertmanager_resend_s: float = Field(
        60.0, description="Alertmanager targets: active alerts are re-posted this often, with endsAt 4 periods ahead "
                          "(as Prometheus does), so Alertmanager never resolves a still-active episode on its own."
    )
    keep_s: float = Field(7 * 86400.0, description="Delivered (or given-up) outbox rows are deleted after this long.")
