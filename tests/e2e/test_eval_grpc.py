"""`scalerl eval --engine grpc` through a real generator service on loopback gives the same numbers as
`--engine embedded` on the same checkpoint and seed (same requests, same engine seed), budget forcing
(sent as the request's budget_forcing field) and greedy included. The call is mutual TLS as a user makes
it: the service has the job's `generator` certificate and lets the extra identity `eval` in; `scalerl
eval` presents `eval`'s certificate from SCALERL_RPC_TLS_DIR."""

from __future__ import annotations

import copy
import json

import pytest

from scalerl.cli import main
from scalerl.config import dump_spec
from scalerl.generator.server import GeneratorServicer
from scalerl.generator.torch_engine import TorchEngine
from scalerl.model.factory import save_model_and_tokenizer
from scalerl.rpc.certs import new_ca, write_tls_dir
from scalerl.rpc.security import ENV_TLS_DIR, RpcSecurity
from scalerl.rpc.server import serve_grpc


@pytest.mark.timeout(300)
def test_grpc_engine_matches_embedded(tiny_spec, tiny_model, tokenizer, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000001"
    save_model_and_tokenizer(tiny_model, tokenizer, ckpt)
    (run / "spec.yaml").write_text(dump_spec(tiny_spec))
    args = ["eval", str(ckpt), "--strategy", "greedy,sample,majority,budget-forcing", "--n", "1,2,4",
            "--max-thinking", "4,8", "--seed", "7", "--json", "--quiet"]

    assert main(args) == 0
    embedded = json.loads(capsys.readouterr().out)

    engine = TorchEngine(copy.deepcopy(tiny_model), tokenizer, seed=7)
    ca = new_ca(tiny_spec.name)
    served_as = RpcSecurity(str(write_tls_dir(tmp_path / "tls-gen", ca.issue("generator"), ca)),
                            clients=frozenset({"eval"}))
    monkeypatch.setenv(ENV_TLS_DIR, str(write_tls_dir(tmp_path / "tls-eval", ca.issue("eval"), ca)))
    server, port = serve_grpc(0, GeneratorServicer(engine, tokenizer, tiny_spec), security=served_as,
                              host="127.0.0.1")
    try:
        assert main([*args, "--engine", "grpc", "--target", f"127.0.0.1:{port}"]) == 0
        served = json.loads(capsys.readouterr().out)
    finally:
        server.stop(grace_s=1.0)

    assert served["engine"] == "grpc" and embedded["engine"] == "embedded"
    a, b = embedded["checkpoints"][0], served["checkpoints"][0]
    assert a["inference"]["gen_tokens"] == b["inference"]["gen_tokens"] > 0
    assert a["points"] == b["points"]  # accuracy, CIs (seeded bootstrap) and token counts, every k
    assert {p["strategy"] for p in b["points"]} >= {"greedy", "sample", "majority"}
    # budget forcing through the service: the same rows, and the caps bind (fewer thinking tokens at 4)
    assert a["budget_forcing"] == b["budget_forcing"]
    caps = {r["max_thinking"]: r for r in b["budget_forcing"]}
    assert set(caps) == {None, 4, 8}
    assert caps[4]["thinking_tokens_per_sample"] <= 4 < caps[None]["thinking_tokens_per_sample"]
