#!/usr/bin/env python3
"""API-server chores of scripts/infra/kueue.sh and certmanager.sh (the standard library only; no kubectl).

    crd_api.py crds KUBECONFIG FILE...     server-side apply each CRD file, then wait until every one
                                           is Established (60 s)
    crd_api.py namespace KUBECONFIG NAME   create the namespace unless it exists
    crd_api.py server KUBECONFIG           print the API server's URL

The kubeconfig is the one scripts/infra/cluster.sh writes: one cluster (server,
certificate-authority-data) and one user with a bearer token. A CRD file is sent as it is (YAML is what
server-side apply takes); its name comes from the file name, as controller-gen writes them
(`<group>_<plural>.yaml` holds `<plural>.<group>`).
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

FIELD_MANAGER = "scalerl-infra"


class Api:
    def __init__(self, kubeconfig: str) -> None:
        text = Path(kubeconfig).read_text()

        def field(key: str) -> str:
            m = re.search(rf"^\s*{key}:\s*(\S+)\s*$", text, re.M)
            if m is None:
                sys.exit(f"{kubeconfig}: no {key}")
            return m.group(1)

        self.server = field("server").rstrip("/")
        self.token = field("token")
        with tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False) as f:
            f.write(base64.b64decode(field("certificate-authority-data")))
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
        group, _, plural = Path(f).name.removesuffix(".yaml").partition("_")
        name = f"{plural}.{group}"
        body = Path(f).read_bytes()
        if f"name: {name}".encode() not in body:
            sys.exit(f"{f}: does not define the CRD {name}")
        status, out = api.call(
            "PATCH", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            f"?fieldManager={FIELD_MANAGER}&force=true", body, "application/apply-patch+yaml")
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
