"""Every measurement of visioncap, in one package; what they measured lives under `benchmarks/` of the repository.

- Shared: `stats` (the one percentile convention, bootstrap intervals), `machine` (what a run was taken on),
  `servers` (starting vLLM for a measurement), `outputs` (results files and the command that made them),
  `workload` and `load` (chat and camera traffic), `fidelity` (a stand-in's cost against its target's).
- `visioncap bench mixed | fidelity | standin | overhead` (`cli`), `visioncap tune` (`tune/`, a sweep of vLLM
  starts over the mixed workload), and the offline benchmarks run as modules: `detector_throughput`,
  `caption_budget`, `api_search`, `scenes`, `hop_ttft`, `soak`.
"""
