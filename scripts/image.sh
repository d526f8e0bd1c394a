#!/usr/bin/env bash
# `make image`: the project's image, built from the Dockerfile users build, with podman/buildah from
# Debian packages and no container registry.
#
#   base   SCALERL_PYTHON_IMAGE when set (e.g. python:3.11.14-slim-bookworm where a registry is reachable);
#          else localhost/scalerl-python:3.11-bookworm, made once from Debian packages (mmdebstrap of
#          bookworm with python3.11, venv, CA certificates and tini, imported with `podman import`) from
#          the host's own apt sources. Cached in podman's storage: made again only when it is missing.
#   image  localhost/scalerl:<version>-cpu, `podman build --format docker --layers` of ./Dockerfile with
#          VARIANT=cpu. The host's CA bundle reaches pip as a build secret (id `ca`: registries here are
#          reached through a proxy whose CA the host trusts; a secret never lands in a layer). The
#          requirements layer caches pip's downloads in a build cache mount, and the code is copied after
#          it, so a code change rebuilds the last layers only.
#
# Usage: scripts/image.sh [--print-tag]   (--print-tag: the tag it builds, nothing else)
# Env:   SCALERL_PYTHON_IMAGE, SCALERL_IMAGE_TAG (default localhost/scalerl:<version>-cpu),
#        SCALERL_IMAGE_CA (the CA bundle handed to pip; default the host's, /etc/ssl/certs/ca-certificates.crt),
#        CONTAINERS_CONF (default: build/image/containers.conf, written here: runc, rlimits this host allows).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO_ROOT/pyproject.toml" | head -1)"
TAG="${SCALERL_IMAGE_TAG:-localhost/scalerl:$VERSION-cpu}"
BASE_TAG="localhost/scalerl-python:3.11-bookworm"
BASE_PACKAGES="python3.11,python3.11-venv,python3-venv,python-is-python3,ca-certificates,bash,passwd,tini"
STATE="$REPO_ROOT/build/image"

log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
since() { echo "$(($(date +%s) - $1)) s"; }

case "${1:-}" in
    --print-tag) echo "$TAG"; exit 0 ;;
    "") ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "scripts/image.sh: unknown argument '$1' (allowed: --print-tag, --help)" >&2; exit 2 ;;
esac
bash "$REPO_ROOT/scripts/infra/node_packages.sh" || die "podman, buildah and mmdebstrap are needed (Debian packages)"
ca="${SCALERL_IMAGE_CA:-/etc/ssl/certs/ca-certificates.crt}"
[[ -r "$ca" ]] || die "SCALERL_IMAGE_CA: cannot read $ca (a PEM bundle of the CAs pip must trust)"

mkdir -p "$STATE"
if [[ -z "${CONTAINERS_CONF:-}" ]]; then
    # crun refuses this kind of host's hybrid cgroups (runc does not), and podman's default rlimits are
    # above what a process may set here without CAP_SYS_RESOURCE.
    cat >"$STATE/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
    export CONTAINERS_CONF="$STATE/containers.conf"
fi

t0="$(date +%s)"
# podman's builds and runs make /run/netns a shared mount of itself and leave it: undone on exit when it was
# not one before and nothing is left in it (the host as it was; the real node's clean-up does the same).
netns_was_mounted=0
mountpoint -q /run/netns 2>/dev/null && netns_was_mounted=1
restore_netns() {
    if ((netns_was_mounted == 0)) && mountpoint -q /run/netns 2>/dev/null && [[ -z "$(ls -A /run/netns)" ]]; then
        umount /run/netns 2>/dev/null || true
    fi
}
trap restore_netns EXIT
base="${SCALERL_PYTHON_IMAGE:-}"
if [[ -z "$base" ]]; then
    base="$BASE_TAG"
    if podman image exists "$base"; then
        log "base: $base (cached)"
    else
        log "base: making $base from Debian bookworm packages ($BASE_PACKAGES)"
        tb="$(date +%s)"
        mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
            --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
            bookworm - 2>"$STATE/mmdebstrap.log" \
            | podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$base" >/dev/null \
            || { tail -n 20 "$STATE/mmdebstrap.log" >&2; die "could not make the base image (log above)"; }
        log "base: made in $(since "$tb") ($(podman image inspect --format '{{.Size}}' "$base" | numfmt --to=iec))"
    fi
fi

log "image: building $TAG from $REPO_ROOT/Dockerfile on $base (log $STATE/build.log)"
tb="$(date +%s)"
# --secret: pip trusts the host's CAs during the build only; VARIANT is passed explicitly (buildah 1.28
# does not apply a global ARG's default to a `FROM base-${VARIANT}`); --format docker keeps SHELL.
if ! podman build --format docker --layers --pull=never \
    --build-arg VARIANT=cpu --build-arg PYTHON_IMAGE="$base" \
    --secret id=ca,src="$ca" \
    -t "$TAG" "$REPO_ROOT" >"$STATE/build.log" 2>&1; then
    tail -n 40 "$STATE/build.log" >&2
    die "podman build failed (log above, $STATE/build.log)"
fi
# the previous build's layers (untagged, unused) go: each rebuild would otherwise keep gigabytes
podman image prune -f >/dev/null 2>&1 || true
size="$(podman image inspect --format '{{.Size}}' "$TAG" | numfmt --to=iec)"
log "image: $TAG built in $(since "$tb") ($size); checking that it starts"
out="$(podman run --rm --pull=never "$TAG" --version 2>&1)" || die "the image does not start: $out"
log "image: \`scalerl --version\` in the image: $out; total $(since "$t0")"
echo "$TAG"
