"""Tied embeddings under the FP32 head: one parameter (gradients from both uses, one optimizer state),
kept through bfloat16, through publishing to the store and into the generator; the chunked head
log-softmax equals the single pass, values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scalerl.generator.torch_engine import TorchEngine
from scalerl.model.factory import head_logprobs, heads_tied, keep_head_in_fp32, sequence_logprobs, trunk_of
from scalerl.store.local import LocalStore
from scalerl.weightsync.manifest import parse_manifest
from scalerl.weightsync.publisher import publish_weights
from scalerl.weightsync.reader import load_weights


def _tied_model(tokenizer, dtype=torch.float32) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").to(dtype)
    keep_head_in_fp32(model)
    return model


def _batch(n=3, length=9, vocab=100):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, vocab, (n, length + 1), generator=g)
    return ids[:, :-1], torch.ones(n, length, dtype=torch.long), ids[:, 1:]


def test_tie_survives_the_fp32_head_and_gets_gradients_from_both_uses(tokenizer):
    model = _tied_model(tokenizer)
    assert heads_tied(model)
    inp, mask, tgt = _batch()
    sequence_logprobs(model, inp, mask, tgt, fp32_head=True)[0].sum().backward()
    tied_grad = model.lm_head.weight.grad.clone()
    # The same weights as two parameters: the tied gradient is the sum of the two uses' gradients.
    untied = copy.deepcopy(model)
    untied.lm_head.weight = torch.nn.Parameter(untied.model.embed_tokens.weight.detach().clone())
    untied.zero_grad(set_to_none=True)
    assert not heads_tied(untied)
    sequence_logprobs(untied, inp, mask, tgt, fp32_head=True)[0].sum().backward()
    both = untied.model.embed_tokens.weight.grad + untied.lm_head.weight.grad
    assert untied.model.embed_tokens.weight.grad.abs().sum() > 0 and untied.lm_head.weight.grad.abs().sum() > 0
    torch.testing.assert_close(tied_grad, both, rtol=1e-5, atol=1e-6)


def test_one_optimizer_state_and_the_tie_holds_after_a_step(tokenizer):
    model = _tied_model(tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # as the learner builds it
    inp, mask, tgt = _batch()
    sequence_logprobs(model, inp, mask, tgt, fp32_head=True)[0].mean().backward()
    opt.step()
    unique = {id(p) for p in model.parameters()}
    assert len(opt.state) == len(unique) == len(list(model.parameters()))
    assert sum(1 for p in opt.state if p is model.lm_head.weight) == 1
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_bfloat16_trunk_with_fp32_tied_head(tokenizer):
    model = _tied_model(tokenizer, torch.bfloat16)
    assert heads_tied(model) and model.lm_head.weight.dtype == torch.float32
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    inp, mask, tgt = _batch()
    assert model.model.embed_tokens(inp).dtype == torch.bfloat16
    logp, _ = sequence_logprobs(model, inp, mask, tgt, fp32_head=True)
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all()


def test_published_weights_store_the_tied_tensor_once_and_load_both_keys(tmp_path, tokenizer):
    model = _tied_model(tokenizer)
    store = LocalStore(tmp_path)
    pv = publish_weights(store, 1, {k: v.detach() for k, v in model.state_dict().items()})
    key = store.key_of(pv.uri)
    stored = {t.name for t in parse_manifest(store.get_bytes(key), key).tensors}
    assert ("lm_head.weight" in stored) != ("model.embed_tokens.weight" in stored), "one tensor saved"
    weights = load_weights(store, pv)
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    torch.testing.assert_close(weights["lm_head.weight"], model.lm_head.weight.detach())
    gen = _tied_model(tokenizer)
    with torch.no_grad():
        gen.model.embed_tokens.weight.zero_()
    TorchEngine(gen, tokenizer).load_weights(weights, 1)
    assert heads_tied(gen)
    torch.testing.assert_close(gen.lm_head.weight, model.lm_head.weight)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_head_equals_single_pass(tokenizer, with_entropy):
    model = _tied_model(tokenizer)
    inp, mask, tgt = _batch(n=4, length=11)
    hidden = trunk_of(model)(input_ids=inp, attention_mask=mask).last_hidden_state
    vocab = len(tokenizer)
    results = []
    for elements in (10**9, 5 * vocab):  # one chunk; chunks of 5 tokens (44 tokens: a ragged last chunk)
        model.zero_grad(set_to_none=True)
        h = hidden.detach().requires_grad_(True)
        logp, ent = head_logprobs(model, h, tgt, fp32_head=True, temperature=0.7, with_entropy=with_entropy,
                                  chunk_elements=elements)
        (logp * torch.linspace(0.1, 1.0, logp.numel()).reshape(logp.shape)).sum().backward()
        results.append((logp.detach(), ent, h.grad.clone(), model.lm_head.weight.grad.clone()))
    (a, ea, ha, wa), (b, eb, hb, wb) = results
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ha, hb)
    torch.testing.assert_close(wa, wb)
    if with_entropy:
        torch.testing.assert_close(ea, eb)
    else:
        assert ea is None and eb is None


@pytest.mark.parametrize("elements", [10**9, 3 * 102])
def test_the_head_on_selected_positions_equals_the_whole_head_there(tokenizer, elements):
    """`where` computes the head only at the selected positions: there logp, entropy and the gradients of a
    loss over them equal the whole-head pass; elsewhere logp and entropy are 0."""
    model = _tied_model(tokenizer)
    inp, mask, tgt = _batch(n=4, length=11)
    where = torch.zeros_like(mask, dtype=torch.bool)
    where[:, 5:9] = True
    where[2, :] = False  # a row with nothing selected
    hidden = trunk_of(model)(input_ids=inp, attention_mask=mask).last_hidden_state.detach()
    weights = torch.linspace(0.1, 1.0, where.numel()).reshape(where.shape) * where
    results = []
    for sel in (None, where):
        model.zero_grad(set_to_none=True)
        h = hidden.clone().requires_grad_(True)
        logp, ent = head_logprobs(model, h, tgt, fp32_head=True, temperature=0.7, with_entropy=True,
                                  chunk_elements=elements, where=sel)
        (logp * weights).sum().backward()
        results.append((logp.detach(), ent, h.grad.clone(), model.lm_head.weight.grad.clone()))
    (a, ea, ha, wa), (b, eb, hb, wb) = results
    torch.testing.assert_close(b[where], a[where])
    torch.testing.assert_close(eb[where], ea[where])
    assert not b[~where].any() and not eb[~where].any()
    torch.testing.assert_close(hb, ha)
    torch.testing.assert_close(wb, wa)
