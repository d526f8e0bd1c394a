"""Prepare an OCI image layout for `ctr images import` of only what containerd lacks (node.sh).

Usage: oci_import.py LAYOUT NAME HAVE
  LAYOUT  an OCI layout written by `skopeo copy ... oci:LAYOUT:NAME` with uncompressed layers
  NAME    the image's name (the layout's org.opencontainers.image.ref.name)
  HAVE    a file of the digests containerd's content store holds (`ctr content ls -q`)

Rewrites LAYOUT/index.json to that one image, named for containerd (io.containerd.image.name), and prints
the paths, relative to LAYOUT, of the blobs the import must carry: the manifest, the config and every
layer containerd does not hold. The layers it holds are found in its store by digest on import, so a
code change moves megabytes, not the gigabytes of the layers below it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(layout_dir: str, name: str, have_file: str) -> int:
    layout = Path(layout_dir)
    have = set(Path(have_file).read_text().split())
    index = json.loads((layout / "index.json").read_text())
    mine = [
        m
        for m in index.get("manifests", [])
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == name
    ]
    if len(mine) != 1:
        print(
            f"oci_import.py: {layout}/index.json has {len(mine)} manifests named {name} (expected 1)", file=sys.stderr
        )
        return 1
    entry = mine[0]
    entry["annotations"]["io.containerd.image.name"] = name
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    manifest = json.loads((layout / "blobs" / "sha256" / entry["digest"].removeprefix("sha256:")).read_text())
    carry = [entry["digest"], manifest["config"]["digest"]]
    carry += [layer["digest"] for layer in manifest["layers"] if layer["digest"] not in have]
    for digest in dict.fromkeys(carry):
        print("blobs/sha256/" + digest.removeprefix("sha256:"))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
