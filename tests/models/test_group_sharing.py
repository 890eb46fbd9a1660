"""Prefix sharing for the group estimators' rollouts (issue #18): k samples of one left-padded prompt encoded as one
row (lrlhf.functional.prefix_sharing.group_layout) give the response logits, log-probs and every parameter's gradient of
the k unshared rows, on llama, qwen2, gpt2 and gpt_neox with eager and sdpa attention. Compared in fp64 under sdpa;
eager runs in fp32, since transformers' eager attention gives NaN for a left-padded row in fp64 (its mask's
finfo.min added to a score overflows to -inf, a padding query's softmax row is all -inf, and its NaN reaches the real
tokens as 0 x NaN). The tolerance, 1e-5 of the largest entry, is argued in tests/models/test_prefix_sharing.py
(_close): the layouts sum the same terms in another order, a few epsilons of fp32 at most for these tiny models,
while a layout error (a wrong position or predictor column, a response seeing another) moves entries by their size."""

import pytest
import torch

from lrlhf.functional import token_logprobs
from lrlhf.functional.prefix_sharing import (
    PADDING,
    PREFIX,
    group_layout,
    group_response_columns,
    group_response_logits,
)
from lrlhf.models.shared_inputs import shared_inputs
from lrlhf.modules.rollout import sequence_inputs

K, R = 3, 5


def _rollout(vocab: int):
    """Two prompts (left-padded to 6 columns: 4 and 6 tokens), each repeated K times, and K x 2 responses; the
    second response of each group stopped early (its later columns hold whatever the sampler wrote)."""
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, vocab, (2, 6), generator=g)
    mask = torch.ones(2, 6, dtype=torch.long)
    prompts[0, :2], mask[0, :2] = 0, 0
    query_ids, query_mask = prompts.repeat_interleave(K, 0), mask.repeat_interleave(K, 0)
    response_ids = torch.randint(2, vocab, (2 * K, R), generator=g)
    response_ids[1::K, 2:] = 1  # an early stop (EOS = 1), then padding
    return query_ids, query_mask, response_ids


def _unshared(model, query_ids, query_mask, response_ids):
    input_ids, attention_mask, position_ids = sequence_inputs(query_ids, query_mask, response_ids)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   logits_to_keep=R + 1).logits
    return logits[:, :R]


def _shared(model, query_ids, query_mask, response_ids, by_columns=True):
    """The shared forward's response logits as GroupSharing runs it (the LM head on the response columns alone), or
    ``by_columns=False`` indexed out of the last ``k R + 1`` columns' logits."""
    ids, positions, segments = group_layout(query_ids, query_mask, response_ids, K)
    inputs = shared_inputs(model, {"input_ids": ids, "position_ids": positions, "segment_ids": segments})
    if not by_columns:
        return group_response_logits(model(**inputs, logits_to_keep=K * R + 1).logits, K, R)
    columns = group_response_columns(query_ids.shape[1], K, R)
    return model(**inputs, logits_to_keep=columns).logits.reshape(-1, R, model.config.vocab_size)


def _close(got, expected, name=""):
    scale = float(expected.abs().max().clamp_min(1e-12))
    error = float((got - expected).abs().max())
    assert error <= 1e-5 * scale, f"{name}: max |difference| {error:.3g} > 1e-5 x {scale:.3g}"


def test_the_layout_by_hand():
    query_ids = torch.tensor([[0, 7, 8], [0, 7, 8], [5, 6, 9], [5, 6, 9]])
    query_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    response_ids = torch.tensor([[11, 12], [13, 14], [15, 16], [17, 18]])
    ids, positions, segments = group_layout(query_ids, query_mask, response_ids, 2)
    assert ids.tolist() == [[0, 7, 8, 11, 12, 13, 14], [5, 6, 9, 15, 16, 17, 18]]
    # the prompt's positions count its attended tokens; both responses continue from the prompt's length
    assert positions.tolist() == [[0, 0, 1, 2, 3, 2, 3], [0, 1, 2, 3, 4, 3, 4]]
    assert segments.tolist() == [[PADDING, PREFIX, PREFIX, 1, 1, 2, 2], [PREFIX, PREFIX, PREFIX, 1, 1, 2, 2]]
    # the last prompt column predicts every response's first token; later tokens the one before them
    logits = torch.arange(2 * 5, dtype=torch.float).reshape(2, 5, 1)  # columns 2..6 of each row
    assert group_response_logits(logits, 2, 2)[..., 0].tolist() == [[0, 1], [0, 3], [5, 6], [5, 8]]
    assert group_response_columns(3, 2, 2).tolist() == [2, 3, 2, 5]  # the same columns, of the whole row
    with pytest.raises(ValueError, match="not whole groups of 3"):
        group_layout(query_ids, query_mask, response_ids, 3)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_shared_groups_give_the_unshared_logprobs_and_gradients(tiny_model, attention):
    tiny_model.config._attn_implementation = attention
    dtype = torch.float64 if attention == "sdpa" else torch.float32  # see the module docstring
    model = tiny_model.to(dtype).eval()
    query_ids, query_mask, response_ids = _rollout(model.config.vocab_size)
    weights = torch.randn(response_ids.shape, dtype=dtype)
    results = []
    for forward in (_unshared, _shared):
        model.zero_grad()
        logits = forward(model, query_ids, query_mask, response_ids)
        logprobs = token_logprobs(logits, response_ids, 0.7)
        (logprobs * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logits.detach(), logprobs.detach(), grads))
    (logits, logprobs, grads), (s_logits, s_logprobs, s_grads) = results
    assert s_logits.shape == logits.shape
    _close(s_logits, logits, "logits")
    _close(s_logprobs, logprobs, "logprobs")
    assert grads.keys() == s_grads.keys() and grads
    for name in grads:
        _close(s_grads[name], grads[name], name)


def test_the_lm_head_on_the_response_columns_gives_the_indexed_logits(tiny_model):
    model = tiny_model.eval()
    query_ids, query_mask, response_ids = _rollout(model.config.vocab_size)
    with torch.no_grad():
        _close(_shared(model, query_ids, query_mask, response_ids),
               _shared(model, query_ids, query_mask, response_ids, by_columns=False), "columns vs indexed")
