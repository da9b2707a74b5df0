# The visioncap image: the pipeline (YOLO on the GPU through PyTorch's CUDA wheels), the gateway, the API and the
# alerts service (one image, one command each). vLLM is not in it: docker-compose runs the official vLLM image
# beside it (see docker-compose.yml), or deploy/vllm-cpu.Dockerfile's on a machine without a GPU.
#
# BASE_IMAGE: the official slim Python image (what `docker compose build` uses), or any Debian 12 image; the
# tests build on one made from Debian's packages (`make deploy-base`), as no registry can be reached there.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm
FROM ${BASE_IMAGE} AS runtime

# torch/torchvision are pinned here, not in pyproject.toml: PyPI's Linux wheels of this pair are CUDA builds
# that carry their own CUDA libraries, and the pair is the one whose NMS works (README, "Environments").
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PATH=/opt/venv/bin:$PATH \
    VISIONCAP_DATA_DIR=/data \
    YOLO_CONFIG_DIR=/data/ultralytics \
    HEALTHCHECK_URL=http://127.0.0.1:8090/healthz

# OpenCV's wheel (a dependency of Ultralytics) needs libGL and GLib at import time. A plain Debian base has no
# Python: Debian's 3.11 then (the slim image's is used as it is). One virtual environment either way: Debian's
# Python refuses pip installs into its own site-packages.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 \
    && if ! command -v python3 >/dev/null; then \
         apt-get install -y --no-install-recommends python3 python3-venv ca-certificates; fi \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# Layers from the slowest-changing up, so that a change to visioncap's code rebuilds only the last ones: torch,
# then the project's dependencies, then the package itself. pip's cache lives in a build cache mount: a rebuild
# after a dependency change reuses the wheels, and the image does not carry them.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"

# The dependency list alone, from pyproject.toml in a stage of its own: copied by content, so that an edit to the
# rest of pyproject.toml (a test marker, the version) leaves the dependency layer cached.
FROM runtime AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
    > requirements.txt

FROM runtime
WORKDIR /opt/visioncap
COPY --from=requirements /src/requirements.txt /tmp/requirements.txt
# The versions CI tested (requirements/app.txt, `make lock`): constraints, so its dev-only pins install nothing.
COPY requirements/app.txt /tmp/app-lock.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -r /tmp/requirements.txt -c /tmp/app-lock.txt "setuptools>=68" \
    && rm /tmp/requirements.txt /tmp/app-lock.txt \
    && useradd --create-home --uid 10001 --user-group visioncap \
    && mkdir -p /data/ultralytics \
    && chown -R visioncap:visioncap /data

COPY pyproject.toml README.md ./
COPY visioncap ./visioncap
COPY models ./models
COPY pipelines ./pipelines
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --no-deps --no-build-isolation .

# Named volumes mounted at /data start as a copy of this folder, owned by the unprivileged user.
VOLUME ["/data"]
WORKDIR /data
USER 10001:10001
ENV VISIONCAP_MODELS_DIR=/opt/visioncap/models

# Each service points HEALTHCHECK_URL at its own port (the API's by default); compose overrides it too.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4)"]

EXPOSE 8080 8090
CMD ["visioncap", "--help"]

# Which release this is (`docker inspect`, `podman image inspect`): deploy/images.sh passes the package's version
# and the commit; /healthz and `visioncap --version` say the same version from inside.
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="visioncap" \
      org.opencontainers.image.description="Camera streams to searchable captions: pipeline, gateway, API, alerts" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
