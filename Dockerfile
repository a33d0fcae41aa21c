# syntax=docker/dockerfile:1.7
#
# hango-worker container image.
#
#   docker build -t hango-worker:dev .
#   docker run --rm -e HANGO_DATABASE_URL=postgresql://… hango-worker:dev          # the service
#   docker run --rm -e HANGO_DATABASE_URL=postgresql://… hango-worker:dev migrate  # one-shot
#
# Stage 1 builds the project's wheel and a wheel of every dependency, at the
# versions pinned in constraints.txt (`make lock` refreshes it); stage 2 installs
# them, offline, into /opt/venv with deploy/install-wheel.sh — the same script
# tests/test_deploy.py runs outside Docker. The final image has no compiler, no
# build tools, no source tree and no wheels left behind (they are bind-mounted
# for the one RUN that installs them). It has no embedded PostgreSQL either (the
# optional `embedded` extra is not installed: set HANGO_DATABASE_URL) and no test
# fakes (.dockerignore keeps hango_worker/testing/ out of the build context).
#
# The base image is pinned by digest as well as by tag (a tag can be re-pushed, a
# digest cannot). To move to a newer base, look the digest up and change both:
#   docker buildx imagetools inspect python:3.11.11-slim-bookworm   # "Digest: sha256:…"

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5

# --- builder -----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

# Compilers only here, for any dependency that ships no wheel for this platform.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py constraints.txt README* LICENSE ./
COPY hango_worker ./hango_worker
# the migrations, shipped inside the wheel as hango_worker/_alembic (setup.py)
COPY alembic ./alembic
# The package's version (what `hango-worker --version` and hango_build_info report): the
# one in pyproject.toml, or the build argument VERSION when given, e.g. from git:
#   --build-arg VERSION=0.1.0+g$(git rev-parse --short HEAD)
# (a PEP 440 version; pip refuses anything else, so a bad one fails the build).
ARG VERSION=
RUN if [ -n "$VERSION" ]; then \
        sed -i "s/^version = \".*\"$/version = \"$VERSION\"/" pyproject.toml \
     && grep -qx "version = \"$VERSION\"" pyproject.toml; \
    fi
# /wheels: hango_worker-<version>-py3-none-any.whl plus one wheel per dependency.
RUN python -m pip wheel --constraint constraints.txt --wheel-dir /wheels . \
 && ls /wheels/hango_worker-*.whl

# --- runtime -----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

# OCI annotations (docs/operations.md "The image"). Set from git when building:
#   docker build \
#     --build-arg VERSION=$(python -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])") \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ) -t hango-worker:<version> .
# `hango-worker --version` reads the installed package's metadata: pyproject.toml's
# version, or VERSION when given (the builder stage writes it into the package).
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="hango-worker" \
      org.opencontainers.image.description="Durable, observable run-worker for LLM agents on Postgres" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="python:3.11.11-slim-bookworm"

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONFAULTHANDLER=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH \
    HANGO_METRICS_PORT=9464 \
    HANGO_DATA_DIR=/var/lib/hango \
    HANGO_LOG_FORMAT=json

# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 hango \
 && useradd --system --uid 10001 --gid hango --home-dir /var/lib/hango --create-home \
        --shell /usr/sbin/nologin hango

# install-wheel.sh also writes the package list of the venv (`pip inspect`: every
# distribution, its version and license metadata) to
# /opt/venv/share/hango-worker/installed-packages.json. A standard SBOM (SPDX) of the
# whole image: `docker buildx build --sbom=true`, which runs BuildKit's scanner image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    --mount=type=bind,source=deploy/install-wheel.sh,target=/usr/local/bin/install-wheel.sh \
    sh /usr/local/bin/install-wheel.sh /opt/venv /wheels/hango_worker-*.whl /wheels

USER 10001:10001
WORKDIR /var/lib/hango

# /metrics, /healthz, /readyz (HANGO_METRICS_PORT).
EXPOSE 9464
# The run console, only when the container runs `console` (docs/operations.md): it
# listens on 127.0.0.1 unless HANGO_CONSOLE_HOST=0.0.0.0 is set.
EXPOSE 9470

# Liveness of the process (not of the database: that is /readyz). Port 0
# (ephemeral) cannot be probed; keep a fixed port in containers.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import os, sys, urllib.request; h = os.environ.get('HANGO_METRICS_HOST', '') or '127.0.0.1'; h = {'0.0.0.0': '127.0.0.1', '::': '::1'}.get(h, h); h = f'[{h}]' if ':' in h else h; sys.exit(0 if urllib.request.urlopen(f'http://{h}:${HANGO_METRICS_PORT:-9464}/healthz', timeout=4).status == 200 else 1)"

# SIGTERM: stop claiming, let runs reach a turn boundary within
# HANGO_SHUTDOWN_GRACE_S, checkpoint, hand them back to the queue, exit. Give the
# container a stop timeout above that grace (compose stop_grace_period,
# Kubernetes terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM

ENTRYPOINT ["hango-worker"]
CMD ["run"]
