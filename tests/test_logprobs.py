"""The loop's token log-probs: the LM head in chunks on the model's own final hidden states equals log-softmax of
the whole logits, values and gradients, at temperature 1 and not, with and without a soft-capped head; neither they
nor the critic's values build a KV cache."""

from __future__ import annotations

import pytest
import torch

from rlctl.rollout import samples
from rlctl.rollout.samples import Sample, collate, token_logprobs
from rlctl.trainer.models import token_values


def _model(**extra):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, **extra,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def _critic():
    """The text critic as the rl stage loads it: a token classifier with one label (its config's use_cache on)."""
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1,
    )  # fmt: skip
    return Qwen2ForTokenClassification(cfg)


def _caches(backbone) -> list:
    """The KV cache each forward pass of `backbone` (the decoder under the head) returns from now on; None: none."""
    seen = []
    backbone.register_forward_hook(lambda _module, _args, out: seen.append(out.past_key_values))
    return seen


def _batch():
    rows = [Sample(0, {}, [5, 6, 7], [8, 9, 10, 11, 2]), Sample(0, {}, [4, 5], [12, 13]), Sample(1, {}, [3], [14])]
    return collate(rows, 0, "cpu")


def _whole(model, batch, temperature):
    t = batch.completion_ids.shape[1]
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    logits = out.logits[:, -t - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entries", [97, 2**26])  # one token per chunk, and all of them in one
def test_chunked_logprobs_equal_the_whole_logits_and_their_gradients(monkeypatch, temperature, entries):
    monkeypatch.setattr(samples, "LOGPROB_CHUNK_ENTRIES", entries)
    model, batch = _model(), _batch()
    want = _whole(model, batch, temperature)
    (want * batch.loss_mask).sum().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got = token_logprobs(model, batch, temperature)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    (got * batch.loss_mask).sum().backward()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want_grads[name], atol=1e-5), name
    with torch.no_grad():
        assert torch.allclose(token_logprobs(model, batch, temperature), want, atol=1e-5)


def test_a_model_with_scaled_logits_is_scored_whole():
    """A head whose output is not the logits alone (here a stand-in config flag of soft-capping) takes the plain
    forward: the chunked path would leave the cap out."""
    model, batch = _model(), _batch()
    model.config.final_logit_softcapping = 30.0
    assert samples._output_head(model) is None
    assert torch.allclose(token_logprobs(model, batch, 1.0), _whole(model, batch, 1.0), atol=1e-6)


@pytest.mark.parametrize("lora", [False, True])
def test_critic_values_and_logprobs_build_no_kv_cache(lora):
    """The loop's scoring forwards never read a cache back, so they build none; the values are the default forward's
    (which builds one), bit for bit, also through PEFT's token-classifier wrapper (the LoRA critic)."""
    critic, policy, batch = _critic().eval(), _model().eval(), _batch()
    t = batch.completion_ids.shape[1]
    with torch.no_grad():
        out = critic(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
        assert out.logits.shape[-1] == 1 and critic.config.use_cache
        default = out.logits[:, -t - 1 : -1, 0].float()
        critic_caches, policy_caches = _caches(critic.model), _caches(policy.model)
        if lora:
            from peft import LoraConfig, get_peft_model

            critic = get_peft_model(critic, LoraConfig(task_type="TOKEN_CLS", r=4, target_modules=["q_proj", "v_proj"]))
        values = token_values(critic, batch)
        token_logprobs(policy, batch, 1.0)
    assert critic_caches == [None] and policy_caches == [None]
    assert values.shape == (3, t) and torch.equal(values, default)
