# syntax=docker/dockerfile:1
#
# Two images from one file (see README "Deploy and observe"):
#
#   docker build --target gateway       -t pandora-gateway .        # slim: no torch
#   docker build --target reward-worker -t pandora-reward-worker .  # CUDA torch + transformers
#
# The gateway runs ONE uvicorn worker per container: its Prometheus metrics live in process
# memory, and it keeps no other state, so scale it with replicas (compose `--scale`, a k8s
# HorizontalPodAutoscaler), not with --workers.
#
# The reward-worker image also serves the gateway's embedded default (`pandora serve` with no
# --upstream-url), which is what docker-compose's `cpu` profile runs: PyPI's Linux torch wheel
# carries CUDA and runs on the CPU when there is no GPU. For a smaller CPU-only image pass
# --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index>.

ARG PYTHON_VERSION=3.11

# ---------------------------------------------------------------------------------------------
# Build stages: install into a virtualenv that the runtime stages copy whole, so the final
# images carry no pip cache, no build tools and no source tree.
FROM python:${PYTHON_VERSION}-slim-bookworm AS build-base
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server/ server/
COPY stoppers/ stoppers/
COPY reward/ reward/

FROM build-base AS build-gateway
# DL3013 (pin versions): this installs the project itself; its dependency ranges live in
# pyproject.toml.
# hadolint ignore=DL3013
RUN pip install ".[gateway]"

FROM build-base AS build-reward-worker
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=""
# torch first, from the chosen index; then the project with the reward extra (which also
# carries the gateway extra, for the cpu profile's embedded gateway).
# hadolint ignore=DL3013
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}" \
    && pip install ".[reward]"

# ---------------------------------------------------------------------------------------------
# Runtime base: non-root user, the stdlib healthcheck, no compilers.
FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    HF_HOME=/home/pandora/.cache/huggingface
RUN groupadd --system --gid 10001 pandora \
    && useradd --system --uid 10001 --gid pandora --create-home --home-dir /home/pandora pandora \
    && mkdir -p /home/pandora/.cache/huggingface \
    && chown -R pandora:pandora /home/pandora/.cache
COPY --chmod=0755 deploy/docker/healthcheck.py /usr/local/bin/pandora-healthcheck
WORKDIR /home/pandora
ENTRYPOINT ["pandora"]

# ---------------------------------------------------------------------------------------------
# The gateway: `pandora serve` against a remote upstream (vLLM) and reward backend.
# Configure with PANDORA_* environment variables (every `pandora serve` flag has one).
FROM runtime AS gateway
COPY --from=build-gateway /opt/venv /opt/venv
ENV PANDORA_HOST=0.0.0.0 \
    PANDORA_PORT=8080
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["pandora-healthcheck"]
CMD ["serve"]

# ---------------------------------------------------------------------------------------------
# The reward worker: `pandora reward-worker --model <reward model>` on a GPU (port 8081).
# /health answers 503 while the model loads, hence the long start period.
FROM runtime AS reward-worker
COPY --from=build-reward-worker /opt/venv /opt/venv
USER 10001:10001
EXPOSE 8081
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["pandora-healthcheck", "http://127.0.0.1:8081/health"]
CMD ["reward-worker", "--host", "0.0.0.0", "--port", "8081"]
