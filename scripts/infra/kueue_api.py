#!/usr/bin/env python3
"""API-server chores of scripts/infra/kueue.sh (stdlib + PyYAML, no kubectl).

    kueue_api.py crds KUBECONFIG FILE...   server-side apply each CRD file, then wait until every one
                                           is Established (60 s)
    kueue_api.py namespace KUBECONFIG NAME create the namespace unless it exists
    kueue_api.py server KUBECONFIG         print the API server's URL

The kubeconfig is the one scripts/infra/cluster.sh writes: one cluster (server,
certificate-authority-data) and one user with a bearer token.
"""

from __future__ import annotations

import base64
import json
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

FIELD_MANAGER = "scalerl-infra-kueue"


class Api:
    def __init__(self, kubeconfig: str) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = cfg["clusters"][0]["cluster"]
        self.server = cluster["server"].rstrip("/")
        self.token = cfg["users"][0]["user"]["token"]
        with tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False) as f:
            f.write(base64.b64decode(cluster["certificate-authority-data"]))
        self.ctx = ssl.create_default_context(cafile=f.name)
        Path(f.name).unlink()

    def call(self, method: str, path: str, body: bytes | None = None,
             ctype: str = "application/json") -> tuple[int, dict]:
        req = urllib.request.Request(self.server + path, data=body, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": ctype, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


def apply_crds(api: Api, files: list[str]) -> None:
    names = []
    for f in files:
        doc = yaml.safe_load(Path(f).read_text())
        name = doc["metadata"]["name"]
        status, out = api.call(
            "PATCH", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            f"?fieldManager={FIELD_MANAGER}&force=true", json.dumps(doc).encode(), "application/apply-patch+yaml")
        if status >= 300:
            sys.exit(f"applying CRD {name} failed: {status} {out.get('message', out)}")
        names.append(name)
    deadline = time.monotonic() + 60
    for name in names:
        while True:
            _, out = api.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c["status"] for c in (out.get("status") or {}).get("conditions") or []}
            if conds.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                sys.exit(f"CRD {name} not Established after 60 s: {conds}")
            time.sleep(0.2)


def namespace(api: Api, name: str) -> None:
    status, out = api.call("POST", "/api/v1/namespaces", json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}).encode())
    if status >= 300 and status != 409:
        sys.exit(f"creating namespace {name} failed: {status} {out.get('message', out)}")


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("crds", "namespace", "server"):
        sys.exit(__doc__)
    api = Api(argv[1])
    if argv[0] == "crds":
        apply_crds(api, argv[2:])
    elif argv[0] == "namespace":
        namespace(api, argv[2])
    else:
        print(api.server)


if __name__ == "__main__":
    main(sys.argv[1:])
