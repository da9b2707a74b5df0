# The visioncap image: the pipeline (YOLO on the GPU through PyTorch's CUDA wheels), the gateway and the API.
# vLLM is not in it: docker-compose runs the official vLLM image beside it (see docker-compose.yml).
FROM python:3.11.14-slim-bookworm

# torch/torchvision are pinned here, not in pyproject.toml: PyPI's Linux wheels of this pair are CUDA builds
# that carry their own CUDA libraries, and the pair is the one whose NMS works (README, "Environments").
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VISIONCAP_DATA_DIR=/data \
    YOLO_CONFIG_DIR=/data/ultralytics \
    HEALTHCHECK_URL=http://127.0.0.1:8090/healthz

# OpenCV's wheel (a dependency of Ultralytics) needs libGL and GLib at import time.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*

RUN pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"

WORKDIR /opt/visioncap
COPY pyproject.toml README.md ./
COPY visioncap ./visioncap
COPY models ./models
COPY pipelines ./pipelines
RUN pip install . \
    && useradd --create-home --uid 10001 --user-group visioncap \
    && mkdir -p /data/ultralytics \
    && chown -R visioncap:visioncap /data

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
