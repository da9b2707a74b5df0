"""What every benchmark shares: `stats` (the one percentile convention, bootstrap intervals), `machine` (what a run
was taken on), `servers` (starting vLLM for a measurement), `outputs` (results files and the command that made
them), `workload` and `load` (chat and camera traffic), `client_priority`, `gateway_proc`, `pgcluster`, `netns`.
Nothing here imports a benchmark."""
