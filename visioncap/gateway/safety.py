"""Whether a gateway configuration may be served on an address: checked before the web stack is imported, so a
refused `visioncap gateway` exits at once, and again by `build_gateway` for anything else that serves one."""

from __future__ import annotations

import os

from visioncap.config.gateway import GatewayConfig
from visioncap.demo_keys import refuse_demo_keys
from visioncap.errors import ConfigError


def check_gateway_can_serve(config: GatewayConfig, host: str, source: str = "gateway config") -> None:
    """A ConfigError naming `source` (where `config` came from) when the gateway could not run safely or usefully
    on `host`: a published demo key reachable from other machines, or vLLM's key not in the environment."""
    refuse_demo_keys(
        host,
        ((key.name, key.sha256) for key in config.keys),
        source,
        "make your own with `visioncap gateway-key` and put its sha256 in the file",
    )
    for index, upstream in enumerate(config.upstreams):
        env = upstream.api_key_env
        # Started without it, every forwarded request would come back 401 from vLLM, long after the cause.
        if env and not os.environ.get(env):
            raise ConfigError(
                f"{source}: upstreams.{index}.api_key_env names {env}, which is not set: set it to the key vLLM "
                "was started with (--api-key or VLLM_API_KEY)"
            )
