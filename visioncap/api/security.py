"""Response headers that keep the page and the API safe in a browser: CSP, no MIME sniffing, no referrer.

Captions are model output, so the page must never run or load what a caption says; the page's own script, style
and thumbnails (blob: URLs of authorised fetches) are all it needs. /docs is Swagger UI, whose page starts itself
with an inline script and inline styles: it gets a policy that allows those and nothing from elsewhere.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAGE_POLICY = "default-src 'self'; img-src 'self' blob: data:; frame-ancestors 'none'"
DOCS_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'"
)


class SecurityHeadersMiddleware:
    """Adds CSP, X-Content-Type-Options and Referrer-Policy to every HTTP response (401s and errors too)."""

    def __init__(self, app: ASGIApp, docs_path: str) -> None:
        self.app = app
        self.docs_path = docs_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = DOCS_POLICY if scope.get("path") == self.docs_path else PAGE_POLICY

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = policy
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Referrer-Policy"] = "no-referrer"
            await send(message)

        await self.app(scope, receive, with_headers)
