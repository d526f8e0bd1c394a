#!/usr/bin/env bash
# The Debian packages the image build (scripts/image.sh) and the real node (node.sh) use, installed when
# one is missing (root and apt: a fresh CI machine). About 30 s; nothing is started.
set -euo pipefail
PACKAGES=(podman buildah runc containerd containernetworking-plugins mmdebstrap iptables conntrack uidmap
    fuse-overlayfs slirp4netns skopeo)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "scripts/infra/node_packages.sh: missing Debian packages: ${missing[*]} (install them as root: apt-get install ${missing[*]})" >&2
    exit 1
fi
printf '[infra %s] installing Debian packages: %s\n' "$(date +%H:%M:%S)" "${missing[*]}" >&2
log="${TMPDIR:-/tmp}/scalerl-apt.$$.log"
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    # a fresh machine may have no package lists yet
    DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1 \
        || { tail -n 20 "$log" >&2; echo "scripts/infra/node_packages.sh: apt-get install failed (log above)" >&2; exit 1; }
fi
rm -f "$log"
