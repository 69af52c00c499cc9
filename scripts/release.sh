#!/usr/bin/env bash
# Build a release into dist/ (make release; CI runs the same):
#
#   rig_conductor-V-py3-none-any.whl, rig_conductor-V.tar.gz   the wheel (built from the sdist)
#   rig-conductor-V.oci.tar, rig-conductor-V-audit.oci.tar      the conductor and audit images
#   rig-conductor-V.tgz                                         the Helm chart
#   rig-conductor-agent-V.tgz (or the package's own name)       the TypeScript runtime, when
#                                                               clients/typescript exists
#   SHA256SUMS                                                  of every file above
#
# V is the one version (scripts/version.py), and every place that names it must agree before
# anything is built. SOURCE_DATE_EPOCH is the last commit's time unless set: every timestamp in
# the wheel, the sdist, the images and the chart comes from it, so rebuilding a commit gives the
# same files, byte for byte, as long as the base image and the package indexes have not moved
# (the audit image installs Debian's current Java, whose CA keystore carries the build's time).
# The images are built without a Docker daemon (scripts/build-image.sh) and left in the local
# storage as localhost/rig-conductor:V and :V-audit as well. tests/release checks the result.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
DIST=${DIST:-dist}
VERSION=$(python3 scripts/version.py)
if ! python3 scripts/version.py --check; then
    echo "release: the places above disagree with the version in src/rig_conductor/__init__.py" >&2
    exit 1
fi
# One commit and one time for every artefact, read once: a commit made while the release builds
# changes neither.
export REVISION=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct "${REVISION}" 2>/dev/null || date +%s)}
echo "release ${VERSION} of ${REVISION}, SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH}"

rm -rf "${DIST}"
mkdir -p "${DIST}"

# A .tar.gz made again from its own content with the commit's time on every file, in a fixed
# order, owned by root and without the gzip header's time: the same bytes on a rebuild.
restamp_tgz() {
    local archive=$1 top=$2 tree
    tree=$(mktemp -d)
    tar -xzmf "${archive}" -C "${tree}"
    tar --sort=name --mtime="@${SOURCE_DATE_EPOCH}" --owner=0 --group=0 --numeric-owner \
        --format=pax --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
        -cf - -C "${tree}" "${top}" | gzip -9n > "${archive}"
    rm -rf "${tree}"
}

# The sdist first, then the wheel built from it: a file the sdist leaves out fails here.
"${PYTHON}" -m build --outdir "${DIST}" .
restamp_tgz "${DIST}/rig_conductor-${VERSION}.tar.gz" "rig_conductor-${VERSION}"

scripts/build-image.sh "localhost/rig-conductor:${VERSION}" "${DIST}/rig-conductor-${VERSION}.oci.tar"
DOCKERFILE=Dockerfile.audit scripts/build-image.sh "localhost/rig-conductor:${VERSION}-audit" \
    "${DIST}/rig-conductor-${VERSION}-audit.oci.tar"

bash scripts/fetch-tools.sh
.cache/tools/bin/helm package charts/rig-conductor --destination "${DIST}"
# helm stamps the files with the time of packaging.
restamp_tgz "${DIST}/rig-conductor-${VERSION}.tgz" rig-conductor

if [[ -f clients/typescript/package.json ]]; then
    dist_dir=$(cd "${DIST}" && pwd)
    (cd clients/typescript && npm ci && npm run build && npm pack --pack-destination "${dist_dir}")
else
    echo "release: no clients/typescript/package.json: no npm tarball in this release"
fi

(cd "${DIST}" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort \
    | xargs sha256sum > SHA256SUMS)
echo "release ${VERSION} in ${DIST}/:"
cat "${DIST}/SHA256SUMS"
