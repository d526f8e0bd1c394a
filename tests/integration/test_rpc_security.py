"""Attacks on a generator's gRPC endpoint under mutual TLS, over real gRPC on loopback with its weights in
the real MinIO (`scalerl.rpc.security`, `generator/server.py` decision 2):

- a call without a client certificate, with a certificate of another job's CA, or in plain text never
  reaches the service (the TLS handshake fails: UNAVAILABLE) and the service counts no request;
- a role's certificate other than the learner's cannot call UpdateWeights (PERMISSION_DENIED); an identity
  the job did not list as an extra client can call nothing;
- the learner itself cannot roll the generator back to an older version, nor make it load an object that
  is not where this job publishes that version (another prefix, a path with `..`): PERMISSION_DENIED,
  and the served version and outputs stay as they were;
- the same as a user sees it with grpcurl (the tool, built by scripts/infra/k8s.sh, with the protos of
  protos/): no client certificate, refused at the handshake; the learner's rollback, PermissionDenied.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from scalerl.generator.server import GeneratorServicer
from scalerl.generator.torch_engine import TorchEngine
from scalerl.messages import PolicyVersion
from scalerl.rpc.certs import CertificateAuthority, new_ca, server_name, write_tls_dir
from scalerl.rpc.client import GeneratorClient
from scalerl.rpc.security import RpcSecurity
from scalerl.rpc.server import serve_grpc
from scalerl.store.factory import open_store
from scalerl.weightsync.manifest import manifest_key
from scalerl.weightsync.publisher import publish_weights
from scalerl.weightsync.reader import load_weights

pytestmark = pytest.mark.infra
LOOPBACK = "127.0.0.1"


def _tls_dir(ca: CertificateAuthority, identity: str, tmp: Path) -> Path:
    """`identity`'s certificate folder under `ca` (tls.crt, tls.key, ca.crt), issued once."""
    folder = tmp / f"{identity}-{id(ca)}"
    return folder if (folder / "tls.crt").exists() else write_tls_dir(folder, ca.issue(identity), ca)


def _as(ca: CertificateAuthority, identity: str, tmp: Path, **kw: Any) -> RpcSecurity:
    return RpcSecurity(str(_tls_dir(ca, identity, tmp)), **kw)


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code()  # type: ignore[no-any-return]


@pytest.fixture
def served(s3_env: Any, unique: str, tiny_model: torch.nn.Module, tokenizer: Any, tiny_spec: Any,
           tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A generator serving version 0 under the job CA (extra client `eval`), its store holding versions 1
    and 2 of this job, and the CA."""
    ca = new_ca(tiny_spec.name)
    store = open_store(f"s3://scalerl-it/{unique}")
    gen = torch.Generator().manual_seed(1)
    weights = {v: {k: t + 0.05 * v * torch.randn(t.shape, generator=gen) for k, t in tiny_model.state_dict().items()}
               for v in (1, 2)}
    published = {v: publish_weights(store, v, w, keep_last=0) for v, w in weights.items()}
    servicer = GeneratorServicer(TorchEngine(copy.deepcopy(tiny_model), tokenizer, seed=0), tokenizer, tiny_spec,
                                 store=store)
    server, port = serve_grpc(0, servicer, host=LOOPBACK,
                              security=_as(ca, "generator", tmp_path, clients=frozenset({"eval"})))
    try:
        yield {"target": f"{LOOPBACK}:{port}", "ca": ca, "store": store, "published": published,
               "servicer": servicer, "tmp": tmp_path}
    finally:
        server.stop(grace_s=1.0)


def test_no_certificate_another_jobs_certificate_or_plain_text_never_reach_the_service(served) -> None:
    target, tmp = served["target"], served["tmp"]
    stranger = new_ca("unit")  # the same job name, another CA: not this job's
    for security in (_as(stranger, "learner", tmp), RpcSecurity.development()):
        with GeneratorClient(target, security=security, timeout_s=5) as client:
            assert _code(lambda c=client: c.generate(["1+2="], n=1)) == grpc.StatusCode.UNAVAILABLE
    # a client presenting no certificate at all (the job's CA to check the server, nothing of its own)
    channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(served["ca"].cert_pem),
                                  options=[("grpc.ssl_target_name_override", "unit.rpc.scalerl")])
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    assert _code(lambda: health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)) \
        == grpc.StatusCode.UNAVAILABLE
    channel.close()
    with GeneratorClient(target, security=_as(served["ca"], "verifier", tmp)) as client:
        assert client.status()["requests_served"] == 0  # nothing above reached the service


def test_only_the_learner_updates_weights_and_unlisted_identities_call_nothing(served) -> None:
    ca, tmp, v1 = served["ca"], served["tmp"], served["published"][1]
    for role in ("verifier", "curriculum", "generator", "operator", "eval"):
        with GeneratorClient(served["target"], security=_as(ca, role, tmp)) as client:
            assert _code(lambda c=client: c.update_weights(v1)) == grpc.StatusCode.PERMISSION_DENIED, role
    with GeneratorClient(served["target"], security=_as(ca, "eval", tmp)) as client:
        assert len(client.generate(["1+2="], n=2)) == 2  # a listed extra identity may generate
    with GeneratorClient(served["target"], security=_as(ca, "grader", tmp)) as client:  # issued, not listed
        assert _code(lambda: client.generate(["1+2="], n=1)) == grpc.StatusCode.PERMISSION_DENIED
        assert _code(client.status) == grpc.StatusCode.PERMISSION_DENIED
    with GeneratorClient(served["target"], security=_as(ca, "operator", tmp)) as client:
        assert client.status()["policy_version"] == 0 and client.status()["weight_updates"] == 0


def test_the_learner_cannot_roll_back_or_load_what_the_job_did_not_publish(served) -> None:
    ca, tmp, store = served["ca"], served["tmp"], served["store"]
    v1, v2 = served["published"][1], served["published"][2]
    with GeneratorClient(served["target"], security=_as(ca, "learner", tmp)) as learner:
        assert learner.update_weights(v2).swapped
        before = learner.generate(["12+34="], n=2)
        denied = learner.update_weights
        assert _code(lambda: denied(v1)) == grpc.StatusCode.PERMISSION_DENIED  # older: a rollback
        assert learner.update_weights(v2).swapped is False  # the version it serves: acknowledged, not reloaded
        # version 3 made of v1's manifest, planted outside the job's prefix and behind a `..`
        data = store.get_bytes(store.key_of(v1.uri))
        key = manifest_key(3, v1.checksum, "snapshot")
        outside = open_store(store.uri("").replace("/it-", "/other-it-", 1).rstrip("/"))
        planted = [PolicyVersion(3, outside.put_bytes(key, data), v1.checksum),
                   PolicyVersion(3, store.uri(f"../{Path(store.uri('')).name}/{key}"), v1.checksum),
                   PolicyVersion(3, store.uri("run/summary.json"), v1.checksum)]
        for pv in planted:
            assert _code(lambda p=pv: denied(p)) == grpc.StatusCode.PERMISSION_DENIED, pv.uri
        status = learner.status()
        assert (status["policy_version"], status["weight_updates"]) == (2, 1)
        assert len(before) == 2
    served_weights = served["servicer"].engine.model.state_dict()
    for name, tensor in load_weights(store, v2).items():  # still exactly version 2's weights
        assert torch.equal(served_weights[name], tensor), name


def test_grpcurl_without_a_certificate_is_refused_and_the_learners_rollback_is_permission_denied(
        served, grpcurl: str) -> None:
    ca, tmp = served["ca"], served["tmp"]
    (tmp / "ca.crt").write_bytes(ca.cert_pem)
    protos = Path(__file__).resolve().parents[2] / "protos"
    base = [grpcurl, "-cacert", str(tmp / "ca.crt"), "-servername", server_name(ca.job), "-import-path", str(protos),
            "-proto", "scalerl/v1/services.proto", "-max-time", "20"]

    def call(identity: str | None, method: str, body: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
        creds: list[str] = []
        if identity is not None:
            folder = _tls_dir(ca, identity, tmp)
            creds = ["-cert", str(folder / "tls.crt"), "-key", str(folder / "tls.key")]
        return subprocess.run([*base, *creds, *flags, "-d", json.dumps(body), served["target"],
                               f"scalerl.v1.Generator/{method}"], capture_output=True, text=True, timeout=60)

    # no client certificate: the server ends every handshake (grpcurl keeps redialling until its connect
    # timeout: grpc-go reports a connection closed during TLS 1.3's last flight as transient), and no call
    # reaches the service
    bare = call(None, "Generate", {"prompts": [{"text": "1+2="}]}, "-connect-timeout", "5")
    assert bare.returncode != 0 and "Failed to dial target host" in bare.stderr, bare.stderr
    # an extra identity the job lists reads the status: version 0 served, no request has reached Generate
    status = call("eval", "Status", {})
    assert status.returncode == 0, status.stderr
    read = json.loads(status.stdout)
    assert read.get("policyVersion", "0") in (0, "0") and read.get("requestsServed", "0") in (0, "0"), read
    # the learner loads version 2, then asks for version 1: a rollback without a restart announcement
    v1, v2 = served["published"][1], served["published"][2]
    loaded = call("learner", "UpdateWeights", {"version": v2.version, "uri": v2.uri, "checksum": v2.checksum})
    assert loaded.returncode == 0 and json.loads(loaded.stdout).get("swapped") is True, loaded.stderr
    back = call("learner", "UpdateWeights", {"version": v1.version, "uri": v1.uri, "checksum": v1.checksum})
    assert back.returncode != 0 and "Code: PermissionDenied" in back.stderr, back.stderr
    # a verifier's certificate may not update weights at all
    other = call("verifier", "UpdateWeights", {"version": 3, "uri": v2.uri, "checksum": v2.checksum})
    assert other.returncode != 0 and "Code: PermissionDenied" in other.stderr, other.stderr
    with GeneratorClient(served["target"], security=_as(ca, "operator", tmp)) as client:
        assert client.status()["policy_version"] == 2


def test_a_renewed_certificate_is_taken_without_a_restart(tiny_model: torch.nn.Module, tokenizer: Any,
                                                          tiny_spec: Any, tmp_path: Path) -> None:
    """The operator renews a Secret (here: a new CA, as when the CA Secret is replaced to revoke everything);
    the server's next connection uses the new files: the new CA's clients get in, the old CA's do not."""
    old, new = new_ca(tiny_spec.name), new_ca(tiny_spec.name)
    folder = tmp_path / "served"
    write_tls_dir(folder, old.issue("generator"), old)
    servicer = GeneratorServicer(TorchEngine(copy.deepcopy(tiny_model), tokenizer, seed=0), tokenizer, tiny_spec)
    server, port = serve_grpc(0, servicer, host=LOOPBACK, security=RpcSecurity(str(folder)))
    target = f"{LOOPBACK}:{port}"
    try:
        with GeneratorClient(target, security=_as(old, "curriculum", tmp_path)) as client:
            assert client.status()["policy_version"] == 0
        staged = write_tls_dir(tmp_path / "staged", new.issue("generator"), new)
        for name in ("tls.crt", "tls.key", "ca.crt"):  # replaced file by file, as a renewal lands
            (staged / name).replace(folder / name)
        with GeneratorClient(target, security=_as(new, "curriculum", tmp_path)) as client:
            assert client.status()["policy_version"] == 0
        with GeneratorClient(target, security=_as(old, "curriculum", tmp_path), timeout_s=5) as client:
            assert _code(client.status) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace_s=1.0)
