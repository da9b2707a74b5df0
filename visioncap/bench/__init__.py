"""Every measurement of visioncap, in one package; what they measured lives under `benchmarks/` of the repository.

One subpackage per benchmark over `common/`, the shared library (`stats`: the one percentile convention and
bootstrap intervals; `machine`: what a run was taken on; `servers`: vLLM for a measurement; `outputs`: results
files and the command that made them; `workload` and `load`: chat and camera traffic). `visioncap bench mixed |
fidelity | standin | overhead` (`cli`: `mixed/`, `standin/`, `overhead/`), `visioncap tune` (`tune/`), and the
benchmarks run as modules: `soak`, `fleet`, `detection.*`, `search.*`, `mixed.hop_ttft`, `mixed.client_stalls`,
`overhead.gateway_hop`. No import cycle, `common/` imports no benchmark, and the product package imports none of
this (tests/test_bench_layout.py).
"""
