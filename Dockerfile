# rig-conductor container image.
#
#   docker build -t rig-conductor:0.2.0 \
#     --build-arg VERSION="$(python3 scripts/version.py)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" .
#
# The builder stage turns the project and all of its runtime dependencies into
# wheels. The final stage installs those wheels only: no compiler, no source
# tree, no pip cache, and the wheels themselves are bind-mounted rather than
# copied (RUN --mount needs BuildKit, the default builder since Docker 23).
# The process runs as uid 10001 and writes nothing outside /tmp, so the root
# filesystem can be mounted read-only.
# The PySpark audit (`rig-conductor audit`) is not part of this image: it runs
# where Spark runs.

ARG PYTHON_IMAGE=python:3.11-slim
#checkov:skip=CKV_DOCKER_7:The base is the PYTHON_IMAGE build argument, a pinned python:3.11-slim by default (scripts/build-image.sh passes a local base)

FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

ARG SOURCE_DATE_EPOCH
WORKDIR /build

# pyproject.toml maps migrations/ into the wheel (rig_conductor._migrations),
# so the builder needs it next to src/.
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY src/ src/
COPY migrations/ migrations/

# constraints.txt: the versions CI tested (make lock). A base without pip (the slim one
# scripts/build-image.sh makes) gets it from ensurepip; the runtime stage borrows a pip wheel
# from here, so the image itself carries no pip.
RUN (python -m pip --version >/dev/null 2>&1 || python -m ensurepip --upgrade) \
    && python -m pip wheel --no-cache-dir --constraint constraints.txt --wheel-dir /wheels . \
    && python -m pip download --no-cache-dir --no-deps --only-binary=:all: --dest /pip pip


FROM ${PYTHON_IMAGE} AS runtime

ARG PYTHON_IMAGE
# Set by scripts/build-image.sh for a release: pip's bytecode then records the sources' hashes,
# not the times they were unpacked at, and useradd the date, so a rebuild matches.
ARG SOURCE_DATE_EPOCH
ARG VERSION=0.2.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=""

LABEL org.opencontainers.image.title="rig-conductor" \
      org.opencontainers.image.description="Control plane that reclaims stranded Redis stream entries from dead agents" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

# RIG_BUILD_REVISION: the commit rig_build_info names (rig_conductor/build.py).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    HOME=/tmp \
    RIG_HTTP_PORT=8080 \
    RIG_BUILD_REVISION=${REVISION}

# The wheels, and the pip that installs them (run from its wheel), are bind-mounted from the
# builder stage, so they never become a layer of this image. pip compiles the installed modules
# to bytecode here, at build time, so nothing needs to be written at run time.
# scripts/prune_image.py then removes, in the same step so no layer keeps them, what nothing
# here loads: the Kubernetes client's asyncio copy, its API groups and models beyond pods and
# Leases, SQLAlchemy's test suite. A base that brought its own pip and setuptools loses them.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    --mount=type=bind,from=builder,source=/pip,target=/pip \
    --mount=type=bind,source=scripts/prune_image.py,target=/prune_image.py \
    python "$(ls /pip/pip-*.whl)/pip" install --no-cache-dir --no-index --find-links=/wheels /wheels/*.whl \
    && python "$(ls /pip/pip-*.whl)/pip" check \
    && python /prune_image.py \
    && (python -m pip uninstall --yes --quiet pip setuptools 2>/dev/null || true) \
    && groupadd --gid 10001 rig \
    && useradd --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin rig

# The migrations ship inside the wheel (rig_conductor._migrations) and
# `rig-conductor migrate` configures alembic in code: nothing else to copy.
WORKDIR /tmp

USER 10001:10001

EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RIG_HTTP_PORT', '8080'), timeout=4)"]

ENTRYPOINT ["rig-conductor"]
CMD ["serve"]
