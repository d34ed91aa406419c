"""Alert webhooks (issue #5, docs/observability.md): episode changes go to a persistent outbox in
the detector's own transaction (outbox.py), a dispatcher delivers them with retries to
receivers chosen by routing (routing.py, dispatcher.py, targets.py): Alertmanager-compatible
webhooks signed with HMAC-SHA256 (payload.py, signing.py) and Alertmanager's /api/v2/alerts."""
