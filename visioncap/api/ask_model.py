"""Which model Ask asks the VLM for, and whether the VLM serves it (for /readyz).

Chat clients send the name GET /v1/models lists, `visioncap-ask`, which no VLM serves. VISIONCAP_ASK_MODEL, when
set, answers every request. Unset, `visioncap-ask` is answered by the model the VLM serves: the first of its GET
/models (vLLM lists its served model first, then any LoRA adapters), learnt on first use and read again once a
minute, so that a VLM restarted with another model is followed without restarting the API. Any other name is
passed on as it is: a client may name a served model or adapter itself.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from visioncap.api.errors import RETRY_AFTER_S, ApiError
from visioncap.api.protocol import Check
from visioncap.config.api import ApiSettings

log = logging.getLogger(__name__)

ASK_MODEL = "visioncap-ask"  # what Ask answers as: the one name GET /v1/models lists
ALIASES = frozenset({ASK_MODEL})
MODELS_TIMEOUT_S = 5.0  # a readiness probe or a first question waits no longer for the VLM's list
KNOWN_FOR_S = 60.0  # how long a learnt model name is used before the VLM's list is read again
SHOWN_MODELS = 5  # a refusal names at most this many served models


class ModelsUnavailable(Exception):
    """The VLM's model list could not be read; the message says why."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable  # no answer at all, as against an answer that is no model list


class AskModel:
    """The model name sent upstream for a request's `model`; one per app."""

    def __init__(self, settings: ApiSettings) -> None:
        self.configured = settings.ask_model
        self.url = settings.vlm_base_url.rstrip("/") + "/models"
        self._key = settings.ask_vlm_api_key
        self._learnt: tuple[str, float] | None = None  # (name, monotonic time learnt): one value, a bounded cache
        self._lock: asyncio.Lock | None = None  # made in the event loop, on first use

    async def served(self, client: httpx.AsyncClient) -> list[str]:
        """The model ids the VLM lists (ModelsUnavailable when it does not answer with a list)."""
        try:
            response = await client.get(
                self.url,
                headers={"Authorization": f"Bearer {self._key.get_secret_value()}"},
                timeout=MODELS_TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            raise ModelsUnavailable(f"GET {self.url}: {type(exc).__name__}", unreachable=True) from exc
        if response.status_code != 200:
            raise ModelsUnavailable(f"GET {self.url}: HTTP {response.status_code}")
        try:
            ids = [str(model["id"]) for model in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelsUnavailable(f"GET {self.url}: not an OpenAI model list") from exc
        if not ids:
            raise ModelsUnavailable(f"GET {self.url}: no model is served")
        return ids

    def learnt(self) -> str | None:
        """The model learnt from the VLM, while it is fresh."""
        if self._learnt is None or time.monotonic() - self._learnt[1] > KNOWN_FOR_S:
            return None
        return self._learnt[0]

    def forget(self) -> None:
        """The VLM refused the learnt name (restarted with another model): read its list again next time."""
        self._learnt = None

    def _learn(self, ids: list[str]) -> str:
        name = ids[0]
        if self._learnt is None or self._learnt[0] != name:
            log.info("ask: %s serves %r; questions to %s go to it", self.url, name, ASK_MODEL)
        self._learnt = (name, time.monotonic())
        return name

    def is_learnt(self, requested: str) -> bool:
        """Whether a request naming `requested` is answered by the learnt model."""
        return self.configured is None and requested in ALIASES

    async def resolve(self, client: httpx.AsyncClient, requested: str) -> str:
        """The model to ask the VLM for on behalf of a request that names `requested`."""
        if self.configured is not None:
            return self.configured
        if requested not in ALIASES:
            return requested
        known = self.learnt()
        if known is not None:
            return known
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # questions that arrive together read the list once
            known = self.learnt()
            if known is not None:
                return known
            try:
                return self._learn(await self.served(client))
            except ModelsUnavailable as exc:
                # "the VLM is unreachable" as when the question itself cannot reach it: one cause, one message.
                said = "the VLM is unreachable" if exc.unreachable else "the VLM's model list is unusable"
                raise ApiError(
                    503,
                    f"{said} ({exc}), so which model it serves is not known; try again shortly, or set "
                    "VISIONCAP_ASK_MODEL",
                    headers={"Retry-After": RETRY_AFTER_S},
                ) from exc

    async def check(self, client: httpx.AsyncClient) -> Check:
        """Readiness: whether the VLM serves the model `visioncap-ask` is answered by."""
        try:
            ids = await self.served(client)
        except ModelsUnavailable as exc:
            return Check(ok=False, detail=str(exc))
        if self.configured is None:
            return Check(ok=True, detail=f"GET {self.url}: {ASK_MODEL} is {self._learn(ids)!r} (the VLM's)")
        if self.configured in ids:
            return Check(ok=True, detail=f"GET {self.url}: {ASK_MODEL} is {self.configured!r} (VISIONCAP_ASK_MODEL)")
        shown = ", ".join(repr(name) for name in ids[:SHOWN_MODELS]) + (", ..." if len(ids) > SHOWN_MODELS else "")
        return Check(
            ok=False,
            detail=f"GET {self.url}: VISIONCAP_ASK_MODEL {self.configured!r} is not served; the VLM serves {shown}",
        )
