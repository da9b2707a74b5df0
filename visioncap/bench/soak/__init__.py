"""Soak benchmark: two real RTSP cameras feed one `visioncap run --serve tiny` for an hour or more while the
memory, open files and threads of every visioncap process are sampled (issue 11, "Runs for months").

    python -m visioncap.bench.soak --minutes 70 --warmup-minutes 10
    python -m visioncap.bench.soak --analyse benchmarks/soak/samples.jsonl   # re-analyse (e.g. a killed run)
"""
