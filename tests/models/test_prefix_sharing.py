"""Prefix sharing (issue #18): a pair's or ranking's prompt encoded once, both continuations after it in one row.

The losses and every parameter's gradient equal the unshared (padded) computation, for the reward model (pairs,
ties, rankings) and DPO (policy and reference), on llama, qwen2, gpt2 and gpt_neox, with eager and sdpa attention,
on multi-turn prompts. Compared in fp64, so the tolerance is far below the issue's 1e-5."""

import warnings

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lrlhf.data.collate import collate_pairs, collate_rankings
from lrlhf.data.records import PreferencePair, Ranking
from lrlhf.data.shared_batches import collate_shared_pairs, collate_shared_rankings, prefix_share, unshare_batch
from lrlhf.data.tokenize import Encoded, encode_pair, encode_ranking
from lrlhf.functional import masked_sum, token_logprobs
from lrlhf.functional.prefix_sharing import common_prefix_length, shared_attention_mask, shared_logprob_sums
from lrlhf.models import LoraSpec, ScalarModel
from lrlhf.models.shared_inputs import can_share, shared_inputs, sharing_blocker
from lrlhf.modules import DPOConfig, DPOModule, RewardConfig, RewardModule

WORDS = "hi hello how are you fine thanks what is two plus three five four ok sure a b c d e f g h no yes".split()
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chatml():
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    assert len(vocab) <= 64  # the tiny models' vocabulary (conftest)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                  eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    return tok


def _m(role, content):
    return {"role": role, "content": content}


def _pairs(tok):
    """Multi-turn prompts; a tie; sides that share their first answer words; one side a prefix of the other."""
    multi = [_m("user", "hi"), _m("assistant", "hello how are you"), _m("user", "what is two plus three")]
    records = [
        PreferencePair(multi, [_m("assistant", "five")], [_m("assistant", "four no")]),
        PreferencePair([_m("user", "how are you")], [_m("assistant", "fine thanks")],
                       [_m("assistant", "fine thanks a b c d")], target=0.5),
        PreferencePair(multi + [_m("assistant", "five"), _m("user", "sure")], [_m("assistant", "yes ok")],
                       [_m("assistant", "yes")]),
        PreferencePair([_m("user", "a b c d e f g h")], [_m("assistant", "ok")], [_m("assistant", "no")], target=0.0),
    ]
    return [encode_pair(tok, r, max_length=64) for r in records]


def _rankings(tok):
    multi = [_m("user", "hi"), _m("assistant", "hello"), _m("user", "what is two plus three")]
    records = [Ranking(multi, [[_m("assistant", a)] for a in ("five", "four", "five ok", "no")], [1, 3, 2, 3]),
               Ranking([_m("user", "how are you")], [[_m("assistant", a)] for a in ("fine", "ok thanks")], [2, 1])]
    return [encode_ranking(tok, r, max_length=64) for r in records]


def _f64(model, attention: str):
    """fp64, the given attention, dropout off (GPT-2's 0.1 would draw other masks for other layouts)."""
    model.config._attn_implementation = attention
    return model.double().eval()


def _grads(module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _close(got: torch.Tensor, expected: torch.Tensor, name: str = "", floor: float = 1e-12) -> None:
    """Equal to 1e-5 of the tensor's largest entry. The models run in fp64, but transformers computes some steps
    in fp32 whatever the dtype (Llama-style RMSNorm upcasts to fp32 and back, eager attention takes its softmax in
    fp32), and sharing sums the same terms in another order (a prefix's gradient arrives from both continuations
    inside one row instead of from two rows): agreement is fp32's epsilon (1.2e-7) times the terms that reach an
    entry, far inside 1e-5, while any layout error (a wrong position, a continuation seeing the other) moves
    entries by their own size."""
    scale = float(expected.abs().max().clamp_min(floor))
    error = float((got - expected).abs().max())
    assert error <= 1e-5 * scale, f"{name}: max |difference| {error:.3g} > 1e-5 x {scale:.3g}"


def _assert_same(a: dict, b: dict):
    """Every gradient equal (``_close``), each to at least 1e-5 of the largest gradient entry of the model: a
    gradient that is 0 in exact arithmetic (a Bradley-Terry loss is blind to a shift of every reward, so the final
    norm's bias gets none through the scalar head) holds rounding noise of the terms that cancel in it, which the
    two layouts sum in another order (1e-17 against an exact 0 seen on gpt_neox); its own size is no scale."""
    assert a.keys() == b.keys() and a
    floor = max(float(t.abs().max()) for t in a.values())
    for name in a:
        _close(b[name], a[name], name, floor=floor)


# ------------------------------------------------------------------------------------------------ the math
def test_the_mask_by_hand():
    # prefix of 2, continuation 1 of 2 tokens, continuation 2 of 1 token, 1 padding column
    mask = shared_attention_mask(torch.tensor([[0, 0, 1, 1, 2, -1]]))[0, 0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],  # the second continuation sees the prefix and itself, not the first one
        [0, 0, 0, 0, 0, 1],  # padding sees only padding (never an empty row)
    ]


@pytest.mark.parametrize(("sequences", "expected"), [
    ([[5, 6, 7], [5, 6, 8, 9]], 2),
    ([[5, 6], [5, 6, 7]], 1),  # one side is a prefix of the other: it keeps its last token
    ([[5, 6, 7], [5, 6, 7]], 2),  # identical
    ([[4, 6], [5, 6]], 0),
    ([[5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 1]], 2),
])
def test_common_prefix_length(sequences, expected):
    assert common_prefix_length([torch.tensor(s) for s in sequences]) == expected


def test_the_layout_maps_every_token_back(chatml):
    pairs = _pairs(chatml)
    padded, shared = collate_pairs(pairs, 0), collate_shared_pairs(pairs, 0)
    # the prompt (4 pairs, 2 sequences each) is encoded once: fewer ids than the sequences hold
    assert shared["input_ids"].numel() < int(padded["lengths"].sum())
    assert prefix_share(pairs) == pytest.approx(
        sum(common_prefix_length([p.chosen.input_ids, p.rejected.input_ids]) for p in pairs)
        / int(padded["lengths"].sum()))
    again = unshare_batch(shared, pad_token_id=0)
    for key in ("input_ids", "attention_mask", "loss_mask", "lengths", "prompt_lengths", "pair_targets", "labels"):
        assert torch.equal(again[key], padded[key]), key
    # positions continue from the prefix in every segment
    for n in range(len(pairs) * 2):
        cols = shared["gather_cols"][n, : shared["lengths"][n]]
        assert shared["position_ids"][shared["gather_rows"][n], cols].tolist() == list(range(len(cols)))


def test_shared_logprob_sums_equal_the_dense_masked_sum():
    torch.manual_seed(0)
    seqs = [torch.tensor([3, 4, 5, 6]), torch.tensor([3, 4, 7]), torch.tensor([3, 4, 5, 6, 8])]
    groups = [[Encoded(s, torch.ones_like(s), torch.arange(len(s)) >= 2, 2) for s in seqs]]
    from lrlhf.data.shared_batches import collate_shared

    shared = collate_shared(groups, 0, [(0, 0), (0, 1), (0, 2)])
    table = torch.randn(10, 10, dtype=torch.float64)  # a bigram "model": logits depend on the current token
    dense = torch.stack([masked_sum(token_logprobs(table[s[:-1]], s[1:]), (torch.arange(len(s)) >= 2)[1:])
                         for s in seqs])
    got = shared_logprob_sums(table[shared["input_ids"]], shared["input_ids"], shared["gather_rows"],
                              shared["gather_cols"], shared["loss_mask"])
    torch.testing.assert_close(got, dense, atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------------- the reward model
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_reward_loss_and_gradients_equal_unshared(chatml, tiny_model, attention):
    pairs = _pairs(chatml)
    module = RewardModule(ScalarModel(_f64(tiny_model, attention)).double(), RewardConfig(center_coef=0.01))
    results = []
    for batch in (collate_pairs(pairs, 0), collate_shared_pairs(pairs, 0)):
        module.zero_grad()
        rewards = module.score(batch)
        loss = module.compute_loss(rewards, batch).loss
        loss.backward()
        results.append((rewards.detach(), loss.detach(), _grads(module)))
    (r0, l0, g0), (r1, l1, g1) = results
    _close(r1, r0, "rewards")
    _close(l1, l0, "loss")
    _assert_same(g0, g1)


def test_reward_rankings_equal_unshared(chatml, tiny_model):
    rankings = _rankings(chatml)
    module = RewardModule(ScalarModel(_f64(tiny_model, "sdpa")).double())
    results = []
    for batch in (collate_rankings(rankings, 0), collate_shared_rankings(rankings, 0)):
        module.zero_grad()
        loss = module.compute_loss(module.score(batch), batch).loss
        loss.backward()
        results.append((loss.detach(), _grads(module)))
    _close(results[1][0], results[0][0], "loss")
    _assert_same(results[0][1], results[1][1])


def test_a_lora_reward_model_and_compile_padding_score_the_same(chatml, tiny_llama):
    pairs = _pairs(chatml)
    module = RewardModule(_f64(tiny_llama, "sdpa"), RewardConfig(lora=LoraSpec(r=4, alpha=8.0))).double()
    padded = module.score(collate_pairs(pairs, 0))
    torch.testing.assert_close(module.score(collate_shared_pairs(pairs, 0)), padded, atol=1e-9, rtol=1e-6)
    # module.config.compile pads a shared batch to a multiple of compile_pad_multiple columns (set after
    # construction, so nothing is compiled here): the padding columns change no score
    module.config = RewardConfig(lora=LoraSpec(r=4, alpha=8.0), compile=True, compile_pad_multiple=16)
    widths, original = [], module.model.hidden_states

    def spy(input_ids, attention_mask, **kw):
        widths.append(input_ids.shape[1])
        return original(input_ids, attention_mask, **kw)

    module.model.hidden_states = spy
    shared = collate_shared_pairs(pairs, 0)
    torch.testing.assert_close(module.score(shared), padded, atol=1e-9, rtol=1e-6)
    assert widths == [-(-shared["input_ids"].shape[1] // 16) * 16] and widths[0] > shared["input_ids"].shape[1]


# -------------------------------------------------------------------------------------------------- DPO
@pytest.mark.parametrize("loss", ["cdpo", "ipo"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_dpo_loss_and_gradients_equal_unshared(chatml, tiny_model, attention, loss):
    """The preference loss and its gradients are the same on prefix-shared and padded batches: cDPO, and IPO, whose
    per-token log-ratios take each completion's length from the batch's loss_mask in either layout."""
    from lrlhf.functional import DPOLoss, IPOLoss

    pairs = _pairs(chatml)
    module = DPOModule(_f64(tiny_model, attention), tokenizer=chatml, config=DPOConfig(lora=LoraSpec(r=4, alpha=8.0)),
                       preference_loss=DPOLoss(label_smoothing=0.1) if loss == "cdpo" else IPOLoss())
    module.double()
    with torch.no_grad():  # LoRA's B starts at 0: move it, so policy and reference differ
        for name, param in module.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    module.log = lambda *a, **k: None
    results = []
    for batch in (collate_pairs(pairs, 0), collate_shared_pairs(pairs, 0)):
        module.zero_grad()
        policy, reference = module.sequence_logprobs(batch), module.reference_logprobs(batch)
        loss = module.shared_step(batch, "train")
        loss.backward()
        results.append(([t.detach() for t in (*policy, *reference)], loss.detach(), _grads(module)))
    for a, b in zip(results[0][0], results[1][0], strict=True):
        _close(b, a, "log-prob sums")
    # and the padded sums are the dense masked sum of every position's log-prob (an independent computation)
    padded = collate_pairs(pairs, 0)
    with torch.no_grad():
        logits = module.model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
    dense = masked_sum(token_logprobs(logits[:, :-1], padded["input_ids"][:, 1:]), padded["loss_mask"][:, 1:], dim=1)
    _close(torch.cat(results[0][0][:2]), dense, "padded sums against the dense computation")
    # the adapter is not a no-op: policy and reference differ, so the loss has a gradient
    assert not torch.allclose(results[0][0][0], results[0][0][2])
    _close(results[1][1], results[0][1], "loss")
    _assert_same(results[0][2], results[1][2])


# ------------------------------------------------------------------------------------ attention without masks
def test_an_attention_without_custom_masks_runs_unshared_with_a_warning(chatml, tiny_llama):
    pairs = _pairs(chatml)
    model = _f64(tiny_llama, "sdpa")
    module = RewardModule(ScalarModel(model).double())
    expected = module.score(collate_pairs(pairs, 0))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="data.prefix_sharing=false"):
        shared_inputs(model, collate_shared_pairs(pairs, 0))
    with pytest.warns(UserWarning, match="run unshared"):
        assert not can_share(model)
    # scoring falls back to the padded layout (run here with sdpa again: flash attention needs a GPU)
    seen = []
    original = module.model.hidden_states

    def spy(input_ids, attention_mask, **kw):
        seen.append(attention_mask.dim())
        model.config._attn_implementation = "sdpa"
        return original(input_ids, attention_mask, **kw)

    module.model.hidden_states = spy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = module.score(collate_shared_pairs(pairs, 0))
    assert seen == [2]
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=1e-6)


def test_dpo_runs_a_shared_batch_unshared_when_the_model_cannot_share(chatml, tiny_llama, monkeypatch):
    pairs = _pairs(chatml)
    module = DPOModule(_f64(tiny_llama, "sdpa"), tokenizer=chatml, config=DPOConfig(lora=LoraSpec(r=4))).double()
    expected = module.sequence_logprobs(collate_pairs(pairs, 0))
    seen = []
    model_forward = module.model.forward
    module.model.forward = lambda **kw: (seen.append(kw["attention_mask"].dim()), model_forward(**kw))[1]
    monkeypatch.setattr("lrlhf.modules.dpo.can_share", lambda model, width: False)
    got = module.sequence_logprobs(collate_shared_pairs(pairs, 0))
    assert seen == [2]  # the padded layout's 2-D mask
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-6)


def test_a_sliding_window_narrower_than_the_row_or_alibi_blocks_sharing(chatml):
    from transformers import BloomConfig, BloomForCausalLM, Qwen2Config, Qwen2ForCausalLM

    windowed = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                                            use_sliding_window=True, sliding_window=16,
                                            max_window_layers=0))
    windowed.config._attn_implementation = "sdpa"
    assert sharing_blocker(windowed, 16) is None
    assert "sliding window (16 tokens)" in sharing_blocker(windowed, 17)
    batch = collate_shared_pairs(_pairs(chatml), 0)
    assert batch["input_ids"].shape[1] > 16
    with pytest.raises(ValueError, match="sliding window.*data.prefix_sharing=false"):
        shared_inputs(windowed, batch)
    bloom = BloomForCausalLM(BloomConfig(hidden_size=32, n_layer=1, n_head=4, vocab_size=64))
    bloom.config._attn_implementation = "sdpa"
    assert "ALiBi" in sharing_blocker(bloom, 8)
