"""A gateway running in a background thread of this process, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

import uvicorn

from visioncap.config.gateway import GatewayConfig
from visioncap.gateway.app import create_app
from visioncap.gateway.realtime import run_realtime
from visioncap.gateway.serving import Gateway

T = TypeVar("T")


class GatewayThread:
    """`with GatewayThread(config) as gw:` serves on `gw.base_url` until the block ends."""

    def __init__(self, config: GatewayConfig, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 30):
        self.config = config
        self.host = host
        self._port = port
        self.startup_timeout_s = startup_timeout_s
        self.app = create_app(config)
        self.gateway: Gateway = self.app.state.gateway
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        assert self._socket is not None, "not started"
        return int(self._socket.getsockname()[1])

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def start(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((self.host, self._port))
        self._socket.listen(1024)  # connections queue in the backlog until uvicorn accepts them
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"gateway-{self.port}", daemon=True)
        self._thread.start()
        while not self.gateway.ready.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError(f"gateway thread ended before serving: {self._error!r}")
            self.startup_timeout_s -= 0.05
            if self.startup_timeout_s <= 0:
                raise TimeoutError("gateway did not start")

    def _run(self) -> None:
        assert self._server is not None and self._socket is not None
        try:
            run_realtime(self.config.process.realtime_priority)  # this thread is the gateway's event loop
            self._server.run(sockets=[self._socket])
        except BaseException as exc:
            self._error = exc
            raise

    def call(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30) -> T:
        """Run a coroutine on the gateway's event loop and return its result (thread-safe)."""
        loop = self.gateway.loop
        assert loop is not None, "not started"

        async def run() -> T:
            return await factory()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout)

    def call_soon(self, function: Callable[[], T], timeout: float = 30) -> T:
        """Run a plain function on the gateway's event loop (where its state lives) and return its result."""

        async def run() -> T:
            return function()

        return self.call(run, timeout)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> GatewayThread:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
