"""Static-cache and compiled decoding (issue #18): the same ids and log-probs as the eager sampler for a seed, with
left-padded prompts and rows that stop early; the compiled step is reused across rollouts of one bucket."""

import pytest
import torch

from lrlhf.models.decoding import _CACHES, COMPILE_SECONDS, MAX_CACHES, resolve
from lrlhf.models.generation import sample_with_logprobs

EOS = list(range(50, 64))  # 14 of the 64 ids stop a row: rows stop at different steps


def _prompts(batch=5, width=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 50, (batch, width), generator=g)
    mask = torch.ones(batch, width, dtype=torch.long)
    for row in range(1, batch):  # left padding of 0..batch-2 columns
        mask[row, : row - 1] = 0
        ids[row, : row - 1] = 1
    return ids, mask


def _sample(model, decoding, ids, mask, seed=0, value_head=None, new=12, bucket=8):
    torch.manual_seed(seed)
    return sample_with_logprobs(model.eval(), ids, mask, max_new_tokens=new, temperature=1.0, eos_token_ids=EOS,
                                pad_token_id=1, value_head=value_head, decoding=decoding, bucket=bucket)


def _same(got, expected):
    assert torch.equal(got[0], expected[0])  # ids
    for a, b in zip(got[1:], expected[1:], strict=True):  # log-probs (and values)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_static_decoding_equals_eager(tiny_model):
    ids, mask = _prompts()
    eager = _sample(tiny_model, "eager", ids, mask)
    stopped = (torch.isin(eager[0], torch.tensor(EOS))).any(dim=1)
    assert stopped.any() and not stopped.all() or eager[0].shape[1] < 12  # some rows stop before others
    _same(_sample(tiny_model, "static", ids, mask), eager)


def test_static_decoding_with_a_value_head_equals_eager(tiny_llama):
    ids, mask = _prompts()
    head = torch.nn.Linear(tiny_llama.config.hidden_size, 1)
    value_head = lambda hidden: head(hidden).squeeze(-1)  # noqa: E731
    _same(_sample(tiny_llama, "static", ids, mask, value_head=value_head),
          _sample(tiny_llama, "eager", ids, mask, value_head=value_head))


def test_the_static_cache_is_reused_and_reset_between_rollouts(tiny_llama):
    ids, mask = _prompts()
    first = _sample(tiny_llama, "static", ids, mask, seed=1)
    caches = _CACHES[tiny_llama]
    assert "_lrlhf_static_caches" not in tiny_llama.__dict__  # beside the model: copies and exports carry none
    cache = next(iter(caches.values()))
    _same(_sample(tiny_llama, "static", ids, mask, seed=1), first)  # a reused cache holds nothing of the last
    assert list(caches.values()) == [cache]
    short = _sample(tiny_llama, "static", ids[:, 2:], mask[:, 2:], seed=1)  # 5 + 12 columns: the same bucket
    assert list(caches.values()) == [cache]
    _same(short, _sample(tiny_llama, "eager", ids[:, 2:], mask[:, 2:], seed=1))
    for rows in range(1, MAX_CACHES + 2):  # other batch sizes: a few shapes kept, the least recently used dropped
        _sample(tiny_llama, "static", ids[:rows], mask[:rows])
    assert len(caches) == MAX_CACHES and cache not in caches.values()


@pytest.mark.slow
def test_compiled_decoding_equals_eager_and_compiles_once_per_bucket(tiny_llama):
    from torch._dynamo.utils import counters

    ids, mask = _prompts()
    eager = _sample(tiny_llama, "eager", ids, mask)
    COMPILE_SECONDS.clear()
    _same(_sample(tiny_llama, "compiled", ids, mask), eager)
    assert list(COMPILE_SECONDS) == [(5, 24)]  # 7 + 12 columns rounded up to the bucket of 8
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    _same(_sample(tiny_llama, "compiled", ids[:, 1:], mask[:, 1:], seed=3),
          _sample(tiny_llama, "eager", ids[:, 1:], mask[:, 1:], seed=3))
    assert counters["stats"]["unique_graphs"] == graphs  # 6 + 12 columns: the same bucket, no new graph
    # a value head's hook would not fire inside the compiled step: with one, the static steps run uncompiled
    head = torch.nn.Linear(tiny_llama.config.hidden_size, 1)
    value_head = lambda hidden: head(hidden).squeeze(-1)  # noqa: E731
    _same(_sample(tiny_llama, "compiled", ids, mask, value_head=value_head),
          _sample(tiny_llama, "eager", ids, mask, value_head=value_head))
    assert counters["stats"]["unique_graphs"] == graphs


def test_resolve():
    assert resolve("auto", torch.device("cpu")) == "eager"  # the compiled step is not faster on a CPU
    assert resolve("auto", torch.device("cuda")) == "eager"  # until a GPU run has measured compiled
    assert resolve("compiled", torch.device("cuda")) == "compiled"
    assert resolve("compiled", torch.device("cuda"), synced=True) == "eager"  # FSDP's collective forwards
    assert resolve("compiled", "cpu", value_head=True) == "static"
    assert resolve("static", "cpu") == "static"
    with pytest.raises(ValueError, match="decoding='fast'"):
        resolve("fast", "cpu")


def test_under_bf16_autocast_the_static_cache_holds_keys_and_values_in_their_dtypes(tiny_model, monkeypatch):
    """Issue #46: on CUDA under bf16-mixed the compiled path crashed in the static cache's update (``index_copy_():
    ... (self) Float and (source) BFloat16``): transformers up to 5.2x allocated a layer's values in its keys' dtype,
    and under autocast a rotary attention makes fp32 keys and bf16 values (the lowest-versions leg, transformers
    5.0, crashes the same way on a CPU). Under ``torch.autocast`` bf16 on a CPU: the static cache stores keys and
    values each in the dtype the attention hands it, and static / compiled decoding give the eager sampler's tokens
    and log-probs under the same autocast."""
    import transformers.cache_utils as cache_utils

    from lrlhf.models.decoding import reserved_layer_class

    given = set()

    def recording(update):
        def record(self, key_states, value_states, *args, **kwargs):
            given.add((key_states.dtype, value_states.dtype))  # what the attention makes, on every transformers
            return update(self, key_states, value_states, *args, **kwargs)
        return record

    for layer_class in (cache_utils.DynamicLayer, reserved_layer_class()):  # the eager sampler's cache: the latter
        monkeypatch.setattr(layer_class, "update", recording(layer_class.update))
    ids, mask = _prompts()
    # compiled: on one architecture (the CPU compile takes a while); static on all four
    for decoding in ("static", "compiled") if tiny_model.config.model_type == "llama" else ("static",):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            eager = _sample(tiny_model, "eager", ids, mask)
            got = _sample(tiny_model, decoding, ids, mask)
        [cache] = [c for key, c in _CACHES[tiny_model].items() if key[0] == ids.shape[0]]
        assert len(given) == 1 and {(layer.keys.dtype, layer.values.dtype) for layer in cache.layers} == given
        assert torch.equal(got[0], eager[0]), decoding
        torch.testing.assert_close(got[1], eager[1], atol=1e-2, rtol=0)  # bf16 kernels: rounding apart


def test_the_eager_cache_grows_in_a_reserved_buffer_and_decodes_as_a_growing_cache(tiny_model, monkeypatch):
    """The eager sampler's cache (:func:`lrlhf.models.decoding.reserved_cache`) gives the ids and log-probs of a
    plain growing ``DynamicCache`` (left padding, a group's shared prefill, rows leaving the batch), and reserves a
    layer's buffer once for the prefill and once per change of the batch's rows -- not at every step."""
    from transformers import DynamicCache

    import lrlhf.models.decoding as decoding
    import lrlhf.models.generation as generation

    ids, mask = _prompts()
    ids, mask = ids.repeat_interleave(2, dim=0), mask.repeat_interleave(2, dim=0)  # k = 2 samples of each prompt
    layer_class = decoding.reserved_layer_class()
    reserves, keeps = [], []
    reserve, keep = layer_class._reserve, generation._EagerDecoder.keep
    monkeypatch.setattr(layer_class, "_reserve", lambda self, *args: (reserves.append(self), reserve(self, *args)))
    monkeypatch.setattr(generation._EagerDecoder, "keep",
                        lambda self, rows: (keeps.append(len(rows)), keep(self, rows)))
    new = 12
    reserved = _sample(tiny_model, "eager", ids, mask, new=new)
    layers = {id(layer) for layer in reserves}
    assert layers and keeps  # every layer of these models reserves; some rows stopped before others
    # per layer: the prefill, its expansion to the group's rows, each cut -- against one copy per step before
    assert len(reserves) == len(layers) * (2 + len(keeps)) < len(layers) * new

    monkeypatch.setattr(decoding, "reserved_cache", lambda config, capacity: DynamicCache(config=config))
    _same(reserved, _sample(tiny_model, "eager", ids, mask, new=new))


def test_a_reserved_layer_follows_the_cache_operations_it_does_not_override():
    """``crop`` and a batch repeat of the base class, then more columns than the reserve: the layer's keys are what a
    plain ``DynamicLayer`` holds after the same calls."""
    from transformers.cache_utils import DynamicLayer

    from lrlhf.models.decoding import reserved_layer_class

    reserved, plain = reserved_layer_class()(capacity=4), DynamicLayer()
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randn(2, 3, n, 5, generator=g) for n in (3, 1, 2, 1)]
    for layer in (reserved, plain):
        layer.update(chunks[0], chunks[0] + 1)
        layer.update(chunks[1], chunks[1] + 1)
        layer.crop(-1)
        layer.batch_repeat_interleave(2)
        layer.update(chunks[2].repeat_interleave(2, dim=0), chunks[2].repeat_interleave(2, dim=0) + 1)  # past 4
        layer.batch_select_indices(torch.tensor([3, 0]))
        layer.update(chunks[3][[1, 0]], chunks[3][[1, 0]] + 1)
    assert reserved.get_seq_length() == plain.get_seq_length() == 6
    assert torch.equal(reserved.keys, plain.keys) and torch.equal(reserved.values, plain.values)
