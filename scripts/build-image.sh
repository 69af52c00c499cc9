#!/usr/bin/env bash
# Build the rig-conductor image from the Dockerfile without a Docker daemon or a registry:
# a Debian bookworm base made with mmdebstrap (cached), then buildah with chroot isolation.
#
#   scripts/build-image.sh [IMAGE [ARCHIVE]]   (default localhost/rig-conductor:dev)
#
# DOCKERFILE=Dockerfile.audit builds the audit image instead. REVISION (default: git's HEAD) is
# the commit the image's labels and rig_build_info name. With ARCHIVE, the image is also
# written there as an OCI archive (what `make release` ships). With SOURCE_DATE_EPOCH set (make
# release sets the last commit's time), the image's created date, its history and the
# timestamps of the files in its layers are that time, so a rebuild of a commit matches.
#
# With Docker instead: docker build -t rig-conductor .  (the Dockerfile's default base).
# Needs Debian's buildah, podman, mmdebstrap and runc (.ci/run installs them), and root.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${1:-localhost/rig-conductor:dev}
ARCHIVE=${2:-}
DOCKERFILE=${DOCKERFILE:-Dockerfile}
CACHE=${RIG_IMAGE_CACHE:-/var/cache/rig-conductor}
BASE_TAR="${CACHE}/base-bookworm-python3-nopip.tar"
BASE_IMAGE=localhost/rig-python-base:bookworm-nopip
mkdir -p "${CACHE}"

# A private containers.conf: runc (crun fails on this kernel's hybrid cgroups), cgroupfs, and
# file limits a Python service needs.
export CONTAINERS_CONF="${CACHE}/containers.conf"
cat > "${CONTAINERS_CONF}" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF

# The base: Debian's python3 in a venv at /usr/local/python (without pip: the image borrows
# one from the builder stage), without docs, man pages or locales. Cached: it changes only with Debian's bookworm packages.
if [[ ! -s "${BASE_TAR}" ]]; then
    echo "building the base rootfs (mmdebstrap, bookworm minbase + python3)"
    mmdebstrap --variant=minbase --format=tar --include=python3,python3-venv,passwd,ca-certificates \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='chroot "$1" python3 -m venv --without-pip /usr/local/python' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "${BASE_TAR}.part"
    mv "${BASE_TAR}.part" "${BASE_TAR}"
fi
if ! podman image exists "${BASE_IMAGE}"; then
    podman import \
        --change 'ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "${BASE_TAR}" "${BASE_IMAGE}" >/dev/null
fi

# pip inside the build reaches the package index as the host does: with the host's CA
# bundle, through a pip config mounted for the build only (nothing of it is in the image).
PIP_CONF=$(mktemp)
trap 'rm -f "${PIP_CONF}"' EXIT
printf '[global]\ncert = /etc/ssl/certs/rig-build-ca.crt\n' > "${PIP_CONF}"

reproducible=()
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [[ -n "${SOURCE_DATE_EPOCH:-}" ]]; then
    reproducible=(--timestamp "${SOURCE_DATE_EPOCH}" --build-arg SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH}")
    created=$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)
fi

# No layer cache: with layers, RUN --mount=type=bind,from=builder fails on a cached stage
# (buildah#4375).
buildah bud --isolation chroot --network host --pull-never --layers=false --format docker \
    --volume "${PIP_CONF}:/etc/pip.conf:ro" \
    --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/rig-build-ca.crt:ro \
    --build-arg PYTHON_IMAGE="${BASE_IMAGE}" \
    --build-arg VERSION="$(python3 scripts/version.py)" \
    --build-arg REVISION="${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" \
    --build-arg CREATED="${created}" \
    "${reproducible[@]}" \
    --file "${DOCKERFILE}" --tag "${IMAGE}" .
podman image inspect --format '{{.Size}}' "${IMAGE}" \
    | awk -v image="${IMAGE}" '{ printf "built %s: %.0f MB\n", image, $1 / 1e6 }'
if [[ -n "${ARCHIVE}" ]]; then
    rm -f "${ARCHIVE}"
    # The reference inside the archive is the tag alone: `skopeo copy oci-archive:FILE
    # docker://REGISTRY/NAME:TAG` names it where it lands.
    buildah push --quiet "${IMAGE}" "oci-archive:${ARCHIVE}:${IMAGE##*:}"
    if [[ -n "${SOURCE_DATE_EPOCH:-}" ]]; then
        # The image's digest is already the same on a rebuild; the archive's own tar headers
        # (times, order, owners) are made so too.
        layout=$(mktemp -d)
        tar -xmf "${ARCHIVE}" -C "${layout}"
        # shellcheck disable=SC2046
        tar --sort=name --mtime="@${SOURCE_DATE_EPOCH}" --owner=0 --group=0 --numeric-owner \
            --format=gnu -cf "${ARCHIVE}" -C "${layout}" $(ls -A "${layout}")
        rm -rf "${layout}"
    fi
    echo "wrote ${ARCHIVE}"
fi
