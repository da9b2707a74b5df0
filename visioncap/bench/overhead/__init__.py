"""`visioncap bench overhead` (`run`: the gateway's cost against direct vLLM) and the hop alone against an
instant upstream (`gateway_hop`, `python -m visioncap.bench.overhead.gateway_hop`)."""
