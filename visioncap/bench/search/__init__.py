"""The search benchmarks: the REST API on a million captions (`api`, `python -m visioncap.bench.search.api`) and
retrieval quality (`quality`, `python -m visioncap.bench.search.quality`)."""
