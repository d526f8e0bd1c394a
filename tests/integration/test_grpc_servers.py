"""The role servers on loopback, through real gRPC: Generate equals the torch engine called directly on
the same seed; UpdateWeights through the real MinIO changes the served policy and the outputs; Score
equals Verifier.score; Learner/Curriculum Status come from their callables; health says SERVING,
reflection lists the four services; a graceful stop lets the call in progress finish."""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from scalerl.config import LengthPenaltyConfig
from scalerl.curriculum.server import CurriculumServicer
from scalerl.generator.engine import SamplingParams, budget_forcing, budget_forcing_of
from scalerl.generator.role import encode_prompt, length_control
from scalerl.generator.server import GeneratorServicer
from scalerl.generator.torch_engine import TorchEngine
from scalerl.learner.server import LearnerServicer
from scalerl.messages import Completion, PolicyVersion, PromptTask, RolloutGroup
from scalerl.rpc.client import CurriculumClient, GeneratorClient, LearnerClient, VerifierClient
from scalerl.rpc.convert import to_proto
from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.security import RpcSecurity
from scalerl.rpc.server import serve_grpc
from scalerl.store.factory import open_store
from scalerl.tasks.registry import build_task
from scalerl.telemetry.metrics import RoleMetrics
from scalerl.verifier.server import VerifierServicer
from scalerl.verifier.verifier import Verifier
from scalerl.weightsync.manifest import manifest_key
from scalerl.weightsync.publisher import publish_weights
from waiting import wait_for

LOOPBACK = "127.0.0.1"
PLAIN = RpcSecurity.development()  # what these tests check is the services; tests/integration/test_rpc_security.py
                                   # checks the transport


class SignallingLock:
    """A lock that says when someone starts waiting for it (to hold a call in progress on purpose)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting = threading.Event()

    def __enter__(self) -> None:
        self.waiting.set()
        self.lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


@pytest.fixture
def engines(tiny_model: torch.nn.Module, tokenizer: Any) -> tuple[TorchEngine, TorchEngine]:
    """Two engines with the same weights and seed: one behind the server, one called directly."""
    return (TorchEngine(copy.deepcopy(tiny_model), tokenizer, seed=0),
            TorchEngine(copy.deepcopy(tiny_model), tokenizer, seed=0))


def _served(*servicers: Any) -> Iterator[tuple[Any, str]]:
    server, port = serve_grpc(0, *servicers, security=PLAIN, host=LOOPBACK)
    try:
        yield server, f"{LOOPBACK}:{port}"
    finally:
        server.stop(grace_s=1.0)


def test_generate_equals_the_engine_called_directly(engines, tokenizer, tiny_spec) -> None:
    served, direct = engines
    metrics = RoleMetrics("generator")
    for _, target in _served(GeneratorServicer(served, tokenizer, tiny_spec, metrics=metrics)):
        with GeneratorClient(target, security=PLAIN) as client:
            # 1) text prompts, the job's sampling and length rules, n = 3
            prompts = ["12+34=", "5+6="]
            got = client.generate_groups(prompts, n=3)
            ids = [encode_prompt(tokenizer, p) for p in prompts]
            want = direct.generate([p for p in ids for _ in range(3)],
                                   SamplingParams(tiny_spec.generation.temperature, tiny_spec.generation.top_p),
                                   length_control(tiny_spec, tokenizer))
            assert got.prompt_token_ids == ids
            assert [c for g in got.completions for c in g] == want  # token ids, logprobs (bit-exact), text, ...
            assert [len(g) for g in got.completions] == [3, 3]
            assert got.policy_version == 0 and all(v == 0 for c in want for v in c.versions)

            # 2) token-id prompt with every override; the 10-token thinking budget narrows the job's
            #    [16, 24] interruption window to [10, 10], interruption off -> truncation
            prompt = encode_prompt(tokenizer, "7+8=")
            got2 = client.generate([prompt], n=2, temperature=0.7, top_p=0.9, thinking_budget_tokens=10,
                                   answer_budget_tokens=4, interruption=False)
            rules = dataclasses.replace(length_control(tiny_spec, tokenizer, interrupt=False),
                                        thinking_budget=10, answer_budget=4, window=(10, 10))
            want2 = direct.generate([prompt, prompt], SamplingParams(0.7, 0.9), rules)
            assert got2 == want2
            assert all(len(c.token_ids) <= 10 + 4 for c in got2)

            tokens = sum(len(c.token_ids) for c in want + want2)
            assert client.status() == {"role": "generator", "id": "generator-0", "ready": True, "policy_version": 0,
                                       "tokens_generated": tokens, "groups_generated": 3, "requests_served": 2,
                                       "weight_updates": 0}
    assert metrics.tokens._value.get() == tokens


def test_generate_serves_episodes_with_the_jobs_tools(tokenizer, tiny_spec) -> None:
    """A job with tools answers Generate with episodes (the role's runner), as the same runner called
    directly; `tools: false` gives single turns; a job without tools refuses `tools: true`."""
    from scalerl.config import spec_from_dict
    from scalerl.environment.tools import Toolbox
    from scalerl.generator.episode import EpisodeRunner
    from scalerl.model.factory import build_tiny_model

    tree = tiny_spec.model_dump()
    tree["model"]["tiny"]["max_positions"] = 512  # room for the tools' instructions
    tiny_spec = spec_from_dict(tree)
    model = build_tiny_model(tiny_spec.model, tokenizer, seed=0).eval()
    served, direct = (TorchEngine(copy.deepcopy(model), tokenizer, seed=0) for _ in range(2))
    greedy = SamplingParams(0.0, 1.0)
    never = 10**6
    free = dataclasses.replace(length_control(tiny_spec, tokenizer), think_close_ids=(never,), eos_id=never)
    runners = [EpisodeRunner(e, tokenizer, Toolbox(("calculator",)), max_turns=2, max_observation_tokens=48,
                             straggler_s=60)  # every turn waits for all its calls: the same batches
               for e in (served, direct)]
    texts = ["12+34=", "5+6="]
    ids = [encode_prompt(tokenizer, runners[0].prompt(t)) for t in texts]
    stops = tuple(tuple(c.token_ids[4:6]) for c in direct.generate(ids, greedy, free))  # where the model "calls"
    for r in runners:
        r.stop_sequences = stops
    for _, target in _served(GeneratorServicer(served, tokenizer, tiny_spec, episodes=runners[0])):
        with GeneratorClient(target, security=PLAIN) as client:
            got = client.generate_groups(texts, n=1, temperature=0.0)
            want = runners[1].generate(ids, greedy, length_control(tiny_spec, tokenizer))
            assert got.prompt_token_ids == ids  # the tools' instructions appended, as in training
            assert [c for g in got.completions for c in g] == want
            assert all(not all(c.loss_mask) for c in want)  # each has an observation, masked
            single = client.generate(["12+34="], temperature=0.0, tools=False)
            assert all(single[0].loss_mask) and single[0].token_ids == direct.generate(
                [encode_prompt(tokenizer, "12+34=")], greedy, length_control(tiny_spec, tokenizer))[0].token_ids
            with pytest.raises(grpc.RpcError) as err:
                client.generate(["1+1="], tools=True, budget_forcing={"max_thinking": 4})
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not with budget_forcing" in \
                err.value.details()
    for _, target in _served(GeneratorServicer(served, tokenizer, tiny_spec)):
        with GeneratorClient(target, security=PLAIN) as client, pytest.raises(grpc.RpcError) as err:
            client.generate(["1+1="], tools=True)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "tools: this job has no tools (environment.tools is empty)"


def test_generate_with_budget_forcing_equals_the_engine_with_the_same_rules(engines, tokenizer, tiny_spec) -> None:
    """Budget forcing over gRPC (the ids `budget_forcing_of` sends) = the engine given the rules directly:
    a forced "</think>" + answer prefix at exactly max_thinking thinking tokens; "Wait" for an early one."""
    served, direct = engines
    close = tokenizer.convert_tokens_to_ids("</think>")
    prefix = tokenizer("A:", add_special_tokens=False)["input_ids"]
    wait = tokenizer("Wait", add_special_tokens=False)["input_ids"]
    base = length_control(tiny_spec, tokenizer)
    prompt = encode_prompt(tokenizer, "12+34=")
    for _, target in _served(GeneratorServicer(served, tokenizer, tiny_spec)):
        with GeneratorClient(target, security=PLAIN) as client:
            for rules in (budget_forcing(base, max_thinking=5, answer_prefix_ids=prefix),
                          budget_forcing(base, min_thinking=12, wait_ids=wait, max_waits=2)):
                sent = budget_forcing_of(rules)
                got = client.generate([prompt], n=4, temperature=1.0, budget_forcing=sent)
                want = direct.generate([prompt] * 4, SamplingParams(1.0, tiny_spec.generation.top_p), rules)
                assert got == want
            capped = client.generate([prompt], n=4, temperature=1.0,
                                     budget_forcing=budget_forcing_of(budget_forcing(base, max_thinking=5,
                                                                                      answer_prefix_ids=prefix)))
            assert any(c.token_ids.index(close) == 5 for c in capped)
            for c in capped:  # 5 sampled thinking tokens (or an earlier </think>), then the forced phrase
                at = c.token_ids.index(close)
                if at == 5:
                    assert c.token_ids[6:6 + len(prefix)] == prefix
                    assert c.loss_mask[5:6 + len(prefix)] == [0] * (1 + len(prefix))  # forced: not trained
                else:
                    assert at < 5


def test_generate_rejects_bad_requests_with_the_field(engines, tokenizer, tiny_spec) -> None:
    vocab = len(tokenizer)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"prompts": []}, "prompts: at least one prompt is required"),
        ({"prompts": ["1+1="], "n": 0}, "samples_per_prompt: must be in 1..1024, got 0"),
        ({"prompts": ["1+1="], "temperature": -1.0}, "temperature: must be in [0, 10]"),
        ({"prompts": ["1+1="], "top_p": 1.5}, "top_p: must be in (0, 1], got 1.5"),
        ({"prompts": ["1+1="], "thinking_budget_tokens": 0}, "thinking_budget_tokens: must be in 1.."),
        ({"prompts": [[1, vocab]]}, f"prompts[0].token_ids: [{vocab}] outside the vocabulary 0..{vocab - 1}"),
        ({"prompts": [[]]}, "prompts[0].token_ids: empty"),
        ({"prompts": ["1+1="] * 5, "n": 1000}, "5000 rows, more than this server's max_rows 4096"),
        ({"prompts": ["1+1="], "budget_forcing": {"max_thinking": 0}},
         "budget_forcing.max_thinking_tokens: must be in 1.."),
        ({"prompts": ["1+1="], "budget_forcing": {"max_waits": 2}}, "budget_forcing.wait_ids: required"),
        ({"prompts": ["1+1="], "budget_forcing": {"max_thinking": 4, "answer_prefix_ids": [vocab]}},
         f"budget_forcing.answer_prefix_ids: [{vocab}] outside the vocabulary"),
    ]
    for _, target in _served(GeneratorServicer(engines[0], tokenizer, tiny_spec)):
        with GeneratorClient(target, security=PLAIN) as client:
            for kwargs, reason in cases:
                with pytest.raises(grpc.RpcError) as err:
                    client.generate(kwargs.pop("prompts"), **kwargs)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert reason in err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                client.update_weights(PolicyVersion(1, "s3://b/p/policy/v1.safetensors", "0" * 64))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # no store configured
            assert client.status()["requests_served"] == 0


@pytest.mark.infra
def test_update_weights_from_minio_changes_the_policy_and_the_outputs(s3_env, unique, engines, tokenizer,
                                                                      tiny_spec) -> None:
    served, direct = engines
    old = TorchEngine(copy.deepcopy(direct.model), tokenizer, seed=0)  # keeps version 0
    store = open_store(f"s3://scalerl-it/{unique}")
    gen = torch.Generator().manual_seed(1)
    new_weights = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in direct.model.state_dict().items()}
    pv = publish_weights(store, 1, new_weights)
    sampling = SamplingParams(1.0, 1.0)
    rules = length_control(tiny_spec, tokenizer)
    prompt = encode_prompt(tokenizer, "12+34=")
    metrics = RoleMetrics("generator")
    for _, target in _served(GeneratorServicer(served, tokenizer, tiny_spec, store=store, metrics=metrics)):
        with GeneratorClient(target, security=PLAIN) as client:
            before = client.generate([prompt], n=2)
            assert before == direct.generate([prompt] * 2, sampling, rules)
            assert before == old.generate([prompt] * 2, sampling, rules)

            upd = client.update_weights(pv)
            assert (upd.previous_version, upd.policy_version, upd.swapped) == (0, 1, True)
            assert upd.load_seconds > 0
            assert client.status()["policy_version"] == 1
            assert client.update_weights(pv).swapped is False  # the same announcement again: no swap

            after = client.generate_groups([prompt], n=2)
            direct.load_weights(new_weights, 1)
            want = direct.generate([prompt] * 2, sampling, rules)
            assert after.completions[0] == want and after.policy_version == 1
            assert all(v == 1 for c in want for v in c.versions)
            stale = old.generate([prompt] * 2, sampling, rules)  # same RNG stream, old weights
            assert [c.logprobs for c in stale] != [c.logprobs for c in want]

            # a shard that does not match its checksum, or a missing version: refused, the served version stays 1
            pv2 = publish_weights(store, 2, {k: v * 2 for k, v in new_weights.items()})
            shard = store.key_of(pv2.uri).replace("manifest.json", "shard-0000")
            store.put_bytes(shard, store.get_bytes(shard)[:-1] + b" ")
            with pytest.raises(grpc.RpcError) as err:
                client.update_weights(pv2)
            assert err.value.code() == grpc.StatusCode.DATA_LOSS and f"shard {shard} is corrupt" in err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                client.update_weights(PolicyVersion(3, store.uri(manifest_key(3, "0" * 64, "delta")), "0" * 64))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert client.status()["policy_version"] == 1 and client.status()["weight_updates"] == 1
    assert metrics.policy_version._value.get() == 1.0


def _rollout() -> RolloutGroup:
    task = PromptTask("p-1", 0, "12+34=", "46", 4, "addition")

    def comp(text: str, n: int, reason: str = "stop") -> Completion:
        return Completion(list(range(5, 5 + n)), [-0.5] * n, [0] * n, [True] * n, reason, text)  # type: ignore[arg-type]

    return RolloutGroup(task, [1, 2, 3], [comp("<think>2+4+0=6,1+3+0=4</think>46", 8),
                                          comp("<think>x</think>45", 8),
                                          comp("<think>2+4+0=6</think>46", 12, "length"),
                                          comp("<think>a</think>46", 12)])


def test_score_equals_verifier_score() -> None:
    task = build_task("addition", digits=2, train_size=10, eval_size=2)
    penalty = LengthPenaltyConfig(max_tokens=10, cache_tokens=4)
    verifier = Verifier(task, penalty=penalty)
    rollout = _rollout()
    for _, target in _served(VerifierServicer(verifier, metrics=RoleMetrics("verifier"))):
        with VerifierClient(target, security=PLAIN) as client:
            scored = client.score(rollout)
            assert scored == verifier.score(rollout)
            # by hand: 1) correct, 8 tokens: 1 + clip((10 - 8)/4 - 1, -1, 0) = 1 - 0.5 = 0.5
            # 2) wrong answer: -1; 3) truncated ("length"): -1 whatever its text
            # 4) correct, 12 tokens: 1 + clip((10 - 12)/4 - 1) = 1 - 1 = 0.0
            assert scored.rewards == [0.5, -1.0, -1.0, 0.0]
            assert scored.correct == [True, False, False, True]
            assert client.status() == {"role": "verifier", "id": "verifier-0", "ready": True, "policy_version": 0,
                                       "groups_scored": 1, "completions_scored": 4, "completions_correct": 2}
            broken = spb.ScoreRequest(rollout=to_proto(rollout))  # the client validates; break it after
            del broken.rollout.completions[0].logprobs[-1]
            with pytest.raises(grpc.RpcError) as err:
                client.stub.Score(broken, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "differ in length" in err.value.details()


def test_status_of_learner_and_curriculum_and_all_four_services_on_one_server(engines, tokenizer,
                                                                                tiny_spec) -> None:
    learner_state = {"step": 12, "groups_consumed": 96, "staleness_versions": 1.25, "policy_version": 12}
    curriculum_state: dict[str, Any] = {"epoch": 1, "prompts_issued": 200, "prompts_inflight": 8}
    servicers = [GeneratorServicer(engines[0], tokenizer, tiny_spec),
                 VerifierServicer(Verifier(build_task("addition", digits=2, train_size=10, eval_size=2))),
                 LearnerServicer(lambda: learner_state, learner_id="learner-a"),
                 CurriculumServicer(lambda: curriculum_state, ready=lambda: False)]
    for _, target in _served(*servicers):
        with LearnerClient(target, security=PLAIN) as lc, CurriculumClient(target, security=PLAIN) as cc:
            ls = lc.status()
            assert (ls["role"], ls["id"], ls["ready"], ls["step"], ls["groups_consumed"], ls["staleness_versions"],
                    ls["policy_version"], ls["groups_dropped_stale"]) == ("learner", "learner-a", True, 12, 96,
                                                                           1.25, 12, 0)
            learner_state["step"] = 13  # read at each call
            assert lc.status()["step"] == 13
            cs = cc.status()
            assert (cs["role"], cs["ready"], cs["epoch"], cs["prompts_issued"], cs["prompts_inflight"]) == (
                "curriculum", False, 1, 200, 8)
            curriculum_state["prompts_isued"] = 1  # a typo in the role's callable: INTERNAL naming it
            with pytest.raises(grpc.RpcError) as err:
                cc.status()
            assert err.value.code() == grpc.StatusCode.INTERNAL
            assert "unknown field 'prompts_isued'" in err.value.details()
            assert "prompts_issued" in err.value.details()  # the allowed names

            health = health_pb2_grpc.HealthStub(lc.channel)
            for service in ("", "scalerl.v1.Generator", "scalerl.v1.Verifier", "scalerl.v1.Learner",
                            "scalerl.v1.Curriculum"):
                reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:
                health.Check(health_pb2.HealthCheckRequest(service="scalerl.v1.Nope"), timeout=5)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND

            db = ProtoReflectionDescriptorDatabase(lc._raw)
            services = set(db.get_services())
            assert {"scalerl.v1.Generator", "scalerl.v1.Verifier", "scalerl.v1.Learner",
                    "scalerl.v1.Curriculum"} <= services
            assert {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
            assert db.FindFileContainingSymbol("scalerl.v1.Generator").name == "scalerl/v1/services.proto"


GRACE_S = 300.0
"""The graceful stop's grace: far longer than the call takes, even on a loaded machine."""


def _refusal(target: str) -> grpc.StatusCode | None:
    """The status code of a new call to `target` that failed, or None if it was served."""
    with GeneratorClient(target, timeout_s=5, security=PLAIN) as late:
        try:
            late.status()
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
    return None


def test_graceful_stop_finishes_the_call_in_progress(engines, tokenizer, tiny_spec) -> None:
    lock = SignallingLock()
    server, port = serve_grpc(0, GeneratorServicer(engines[0], tokenizer, tiny_spec, engine_lock=lock),  # type: ignore[arg-type]
                              security=PLAIN, host=LOOPBACK)
    target = f"{LOOPBACK}:{port}"
    client = GeneratorClient(target, security=PLAIN)
    try:
        with lock.lock:  # the handler will wait here: a call in progress
            result: dict[str, Any] = {}
            caller = threading.Thread(target=lambda: result.update(out=client.generate(["1+2="], n=2)))
            caller.start()
            assert lock.waiting.wait(30), "the call never reached the handler"
            stopper = threading.Thread(target=server.stop, kwargs={"grace_s": GRACE_S})
            stopper.start()
            # new calls are refused (UNAVAILABLE) while the server drains; polled, as the stopper thread starts
            # when it can (a probe in flight at that moment may come back CANCELLED instead)
            wait_for("a new call refused as UNAVAILABLE",
                     lambda: _refusal(target) == grpc.StatusCode.UNAVAILABLE, timeout_s=30)
            assert stopper.is_alive(), "stop() waits for the call in progress"
        caller.join(GRACE_S)
        stopper.join(GRACE_S)
        assert not stopper.is_alive()
        # finished normally, not cancelled when the grace ran out (that would leave no "out"): no wall-clock
        # bound, which a loaded machine overruns while the call is still generating
        assert len(result["out"]) == 2 and all(c.token_ids for c in result["out"])
    finally:
        client.close()
        server.stop(grace_s=0)
