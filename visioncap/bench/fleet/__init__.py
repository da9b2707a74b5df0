"""`python -m visioncap.bench.fleet`: cameras per worker (`capacity`), takeover times (`takeover`), cameras per
GPU (`model`), over the processes and cluster they share (`parts`), written by `render`; `run` drives them."""
