"""Packed rows must give the same per-token logits and the same summed NLL as one sequence per row."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lrlhf.data.collate import (
    collate_packed,
    collate_packed_pairs,
    collate_pairs,
    collate_sft,
    model_inputs,
    pack_greedy,
)
from lrlhf.data.records import SFTExample
from lrlhf.data.tokenize import EncodedPair, encode_sft

CHATS = [
    [("user", "hi"), ("assistant", "hello")],
    [("system", "you are kind"), ("user", "what is two plus three"), ("assistant", "five"),
     ("user", "thanks"), ("assistant", "ok bye")],
    [("user", "how are you"), ("assistant", "fine thanks")],
    [("user", "a b c d"), ("assistant", "e f g h a b")],
]


def _examples(tok):
    out = []
    for chat in CHATS:
        example = SFTExample(messages=[{"role": r, "content": c} for r, c in chat])
        out.append(encode_sft(tok, example, max_length=64, loss_on="all"))
    return out


def _model(tok, attn):
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        vocab_size=len(tok), max_position_embeddings=128, attn_implementation=attn,
    )
    return LlamaForCausalLM(config).eval()


def _token_nll(logits, input_ids, loss_mask):
    """(R, L) NLL of input_ids[:, t] under logits[:, t - 1] where loss_mask[:, t], 0 elsewhere (fp32)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.where(loss_mask[:, 1:], nll, torch.zeros_like(nll))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_equals_unpacked(chatml, attn):
    examples = _examples(chatml)
    model = _model(chatml, attn)
    rows = pack_greedy([len(e.input_ids) for e in examples], max_length=40)
    assert any(len(r) > 1 for r in rows)  # something is really packed
    packed = collate_packed([[examples[i] for i in row] for row in rows], chatml.pad_token_id)
    assert "attention_mask" not in packed
    with torch.no_grad():
        packed_logits = model(**model_inputs(packed)).logits
        unpacked = collate_sft(examples, chatml.pad_token_id)
        logits = model(**model_inputs(unpacked)).logits

    total_packed = _token_nll(packed_logits, packed["input_ids"], packed["loss_mask"]).double().sum()
    total = _token_nll(logits, unpacked["input_ids"], unpacked["loss_mask"]).double().sum()
    # Same arithmetic on the same tokens, only the summation order of masked-out keys differs: fp32 rounding.
    # Summed in fp64 (one fp32 ulp of a total of ~60 is 3.8e-6); a token's NLL moves by at most twice its
    # logits' largest difference (<= 1e-5, checked below) plus the rounding of each side's fp32 log-softmax
    # (u times the logit, max and log-sum-exp; (V + 2) u for the sum of V exponentials).
    assert total > 0
    z, u = logits.double(), 2.0**-24
    rounding = u * (4 * z.abs().amax(-1) + 2 * torch.logsumexp(z, -1).abs() + z.shape[-1] + 4).amax()
    n_targets = int(unpacked["loss_mask"][:, 1:].sum())
    assert abs(total_packed - total) <= n_targets * (2 * 1e-5 + 2 * rounding)
    for row_index, row in enumerate(rows):
        col = 0
        for i in row:
            n = len(examples[i].input_ids)
            torch.testing.assert_close(
                packed_logits[row_index, col:col + n], logits[i, :n], rtol=0, atol=1e-5
            )
            col += n


@pytest.mark.parametrize(
    "bad_kwargs",
    [
        pytest.param({}, id="no-position-restarts"),
        # transformers 5.24 skips packed-sequence detection when a KV cache exists, and Llama makes one by
        # default even in train mode: this is why model_inputs passes use_cache=False.
        pytest.param({"use_cache": None}, id="default-use-cache"),
    ],
)
def test_packing_breaks_without_model_inputs(chatml, bad_kwargs):
    """The equality test above can fail: without the packed call convention sequences attend across rows."""
    examples = _examples(chatml)[:2]
    model = _model(chatml, "sdpa").train()
    packed = collate_packed([examples], chatml.pad_token_id)
    with torch.no_grad():
        good = model(**model_inputs(packed)).logits
        if "use_cache" in bad_kwargs:
            bad = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
        else:
            bad = model(input_ids=packed["input_ids"]).logits
    n0 = len(examples[0].input_ids)
    torch.testing.assert_close(good[0, :n0], bad[0, :n0])  # causal: the first sequence is unaffected
    assert (good[0, n0:] - bad[0, n0:]).abs().max() > 1e-3


def test_collate_packed_layout(chatml):
    examples = _examples(chatml)
    a, c = examples[0], examples[2]
    batch = collate_packed([[a, c], [a]], chatml.pad_token_id)
    na, nc = len(a.input_ids), len(c.input_ids)
    assert batch["input_ids"].shape == (2, na + nc)
    assert batch["position_ids"][0].tolist() == list(range(na)) + list(range(nc))
    assert batch["position_ids"][1].tolist() == list(range(na)) + list(range(nc))  # padding: own sequence
    assert batch["sequence_ids"][1].tolist() == [0] * na + [-1] * nc
    assert batch["input_ids"][1, na:].tolist() == [chatml.pad_token_id] * nc
    assert not batch["loss_mask"][1, na:].any()
    expected = torch.cat([a.loss_mask, c.loss_mask])
    expected[0] = expected[na] = False
    assert batch["loss_mask"][0].tolist() == expected.tolist()
    assert batch["labels"][0].tolist() == torch.where(expected, batch["input_ids"][0], -100).tolist()


def test_pack_greedy():
    assert pack_greedy([5, 3, 4, 2, 6], max_length=8) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="sequence 1 has 9 tokens"):
        pack_greedy([1, 9], max_length=8)


def test_packed_pairs_read_the_same_last_token_outputs(chatml):
    """What a reward model reads (the output at each sequence's last token) is the same packed or not."""
    examples = _examples(chatml)
    pairs = [EncodedPair(examples[0], examples[1], 1.0), EncodedPair(examples[2], examples[3], 0.5)]
    model = _model(chatml, "sdpa")
    packed = collate_packed_pairs([pairs], chatml.pad_token_id)
    unpacked = collate_pairs(pairs, chatml.pad_token_id)
    with torch.no_grad():
        packed_logits = model(**model_inputs(packed)).logits
        logits = model(**model_inputs(unpacked)).logits
    # rows: chosen 0, chosen 1, rejected 0, rejected 1
    last = logits[torch.arange(4), unpacked["lengths"] - 1]
    chosen = packed_logits[packed["chosen_end"][:, 0], packed["chosen_end"][:, 1]]
    rejected = packed_logits[packed["rejected_end"][:, 0], packed["rejected_end"][:, 1]]
    torch.testing.assert_close(torch.cat([chosen, rejected]), last, rtol=0, atol=1e-5)
    assert packed["pair_targets"].tolist() == unpacked["pair_targets"].tolist() == [1.0, 0.5]
