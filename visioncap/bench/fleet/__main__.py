from visioncap.bench.fleet.run import app

app(prog_name="python -m visioncap.bench.fleet")
