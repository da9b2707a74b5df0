"""Webhook sender: each delivery as a JSON POST, signed with HMAC-SHA256, with the delivery id as its
idempotency key."""

from __future__ import annotations

import hashlib
import hmac
import os

import httpx

from visioncap.alerts.delivery import Outcome
from visioncap.alerts.store import Due
from visioncap.config.alerts import WebhookDestination
from visioncap.errors import ConfigError

SIGNATURE_HEADER = "X-Visioncap-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# Answers that say "later": the receiver is busy or briefly broken. Other 4xx refuse the message for good.
_RETRYABLE_4XX = frozenset({408, 409, 425, 429})


def signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class WebhookSender:
    def __init__(self, destination: WebhookDestination) -> None:
        self.destination = destination
        self._secret: bytes | None = None
        if destination.secret_env is not None:
            value = os.environ.get(destination.secret_env)
            if not value:
                raise ConfigError(f"webhook {destination.name}: environment variable {destination.secret_env} is unset")
            self._secret = value.encode()
        self._client = httpx.Client(timeout=destination.timeout_s, follow_redirects=False)

    @property
    def timeout_s(self) -> float:
        return self.destination.timeout_s

    def send(self, delivery: Due) -> Outcome:
        body = delivery.body.encode()
        headers = {
            "Content-Type": "application/json",
            IDEMPOTENCY_HEADER: str(delivery.id),
            "X-Visioncap-Event": delivery.topic,
        }
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = signature(self._secret, body)
        try:
            response = self._client.post(self.destination.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return Outcome(False, f"{type(exc).__name__}: {exc}")
        if response.is_success:
            return Outcome(True)
        error = f"HTTP {response.status_code}"
        return Outcome(False, error, permanent=response.is_client_error and response.status_code not in _RETRYABLE_4XX)

    def close(self) -> None:
        self._client.close()
