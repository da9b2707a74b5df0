"""Benchmarks against real servers: `visioncap bench mixed` (chat latency beside a camera caption flood)."""
