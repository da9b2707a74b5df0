"""`python -m visioncap.bench mixed [--quick]`, the same as `visioncap bench mixed`."""

from visioncap.bench.cli import bench_app

bench_app(prog_name="python -m visioncap.bench")
