"""sample_with_logprobs: log-probs (and values) equal to a teacher-forced forward; the categorical sampler draws
each id with its probability; EOS handling as ``generate``."""

import pytest
import torch

from lrlhf.models.generation import repeated_rows, sample_categorical, sample_with_logprobs

VOCAB = 64  # the vocabulary of conftest._tiny

PAD, EOS = 0, 1


def _prompts():
    """Three left-padded prompts of lengths 5, 2 and 7 (ids never PAD or EOS)."""
    g = torch.Generator().manual_seed(0)
    lengths = [5, 2, 7]
    ids = torch.full((3, 7), PAD)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, 7 - n:] = torch.randint(2, VOCAB, (n,), generator=g)
        mask[row, 7 - n:] = 1
    return ids, mask


def test_categorical_sampler_draws_each_id_with_its_probability():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0], [1.5, 0.0, 0.6, 0.9, 0.0]])
    n = 100_000
    torch.manual_seed(0)
    draws = sample_categorical(probs.repeat_interleave(n, dim=0)).view(3, n)
    for row, expected in zip(draws, probs / probs.sum(-1, keepdim=True), strict=True):
        freq = torch.bincount(row, minlength=5).double() / n
        sigma = (expected.double() * (1 - expected.double()) / n).sqrt()
        assert ((freq - expected.double()).abs() <= 5 * sigma + 1e-12).all(), (freq, expected)
        assert (freq[expected == 0] == 0).all()  # a zero-probability id is never drawn


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_teacher_forced_forward(tiny_model, temperature):
    model = tiny_model.eval()
    ids, mask = _prompts()
    torch.manual_seed(3)
    sampled, logprobs = sample_with_logprobs(model, ids, mask, max_new_tokens=12, temperature=temperature,
                                             eos_token_ids=[EOS], pad_token_id=PAD)
    assert sampled.shape == logprobs.shape and sampled.shape[0] == 3
    # each row alone, unpadded, teacher-forced through its sampled ids up to and including its stop
    for row in range(ids.shape[0]):
        prompt = ids[row][mask[row].bool()]
        stops = (sampled[row] == EOS).nonzero()
        n = int(stops[0]) + 1 if len(stops) else sampled.shape[1]
        with torch.no_grad():
            logits = model(input_ids=torch.cat([prompt, sampled[row, :n]])[None]).logits[0]
        direct = torch.log_softmax(logits[len(prompt) - 1:len(prompt) - 1 + n] / temperature, dim=-1)
        direct = direct.gather(-1, sampled[row, :n, None]).squeeze(-1)
        torch.testing.assert_close(logprobs[row, :n], direct, atol=1e-5, rtol=0)


def test_values_of_a_head_on_the_trunk_equal_a_teacher_forced_pass(tiny_model):
    from lrlhf.models.heads import ScalarHead, decoder

    model = tiny_model.eval()
    head = ScalarHead(model.config.hidden_size)
    ids, mask = _prompts()
    torch.manual_seed(5)
    plain = sample_with_logprobs(model, ids, mask, max_new_tokens=6, temperature=1.0, eos_token_ids=[EOS],
                                 pad_token_id=PAD)
    torch.manual_seed(5)
    sampled, logprobs, values = sample_with_logprobs(model, ids, mask, max_new_tokens=6, temperature=1.0,
                                                     eos_token_ids=[EOS], pad_token_id=PAD, value_head=head)
    assert torch.equal(sampled, plain[0]) and torch.equal(logprobs, plain[1])  # the head changes nothing else
    for row in range(ids.shape[0]):
        prompt = ids[row][mask[row].bool()]
        stops = (sampled[row] == EOS).nonzero()
        n = int(stops[0]) + 1 if len(stops) else sampled.shape[1]
        with torch.no_grad():
            hidden = decoder(model)(input_ids=torch.cat([prompt, sampled[row, :n]])[None]).last_hidden_state[0]
            direct = head(hidden[len(prompt) - 1:len(prompt) - 1 + n])
        torch.testing.assert_close(values[row, :n], direct, atol=1e-5, rtol=0)


def test_stops_with_eos_pads_after_it_and_ends_when_every_row_stopped(tiny_llama):
    model = tiny_llama.eval()
    with torch.no_grad():  # a model that almost always says EOS after a few tokens: bias the LM head
        model.lm_head.weight[EOS] = 0.0
        model.lm_head.weight[EOS, :4] = 2.0
    ids, mask = _prompts()
    torch.manual_seed(0)
    sampled, logprobs = sample_with_logprobs(model, ids, mask, max_new_tokens=40, temperature=1.0,
                                             eos_token_ids=[EOS], pad_token_id=PAD)
    assert sampled.shape[1] < 40  # stopped early: every row has an EOS
    assert logprobs.shape == sampled.shape
    for row in sampled:
        first = int((row == EOS).nonzero()[0])
        assert (row[first + 1:] == PAD).all()
    assert (sampled == EOS).any(dim=1).all()


def test_one_token_and_bad_arguments(tiny_llama):
    ids, mask = _prompts()
    sampled, logprobs = sample_with_logprobs(tiny_llama.eval(), ids, mask, max_new_tokens=1, temperature=1.0,
                                             eos_token_ids=[EOS], pad_token_id=PAD)
    assert sampled.shape == logprobs.shape == (3, 1)
    assert (logprobs <= 0).all()
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sample_with_logprobs(tiny_llama, ids, mask, max_new_tokens=4, temperature=0.0, eos_token_ids=[EOS],
                             pad_token_id=PAD)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        sample_with_logprobs(tiny_llama, ids, mask, max_new_tokens=0, temperature=1.0, eos_token_ids=[EOS],
                             pad_token_id=PAD)


def test_repeated_rows_are_runs_of_adjacent_rows_with_equal_ids_and_mask():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 5, 6], [0, 5, 6], [0, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1]])
    rows, expand = repeated_rows(ids, mask)  # row 3 repeats row 0 but not adjacently; row 5 differs by its mask
    assert rows.tolist() == [0, 2, 3, 5]
    assert expand.tolist() == [0, 0, 1, 2, 2, 3]
    assert torch.equal(ids[rows][expand], ids) and torch.equal(mask[rows][expand], mask)
    assert repeated_rows(ids[1:4], mask[1:4]) is None  # no row repeats its predecessor


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_groups_repeated_prompt_is_prefilled_once_with_the_same_samples(tiny_model, temperature):
    model = tiny_model.double().eval()  # fp64: the two prefills' batch sizes round alike, so the draws are equal
    ids, mask = _prompts()
    ids, mask = ids.repeat_interleave(3, dim=0), mask.repeat_interleave(3, dim=0)  # 3 prompts x k = 3
    prefill_rows = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: prefill_rows.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    out = {}
    for share in (True, False):
        prefill_rows.clear()
        torch.manual_seed(5)
        out[share] = sample_with_logprobs(model, ids, mask, max_new_tokens=10, temperature=temperature,
                                          eos_token_ids=[EOS], pad_token_id=PAD, share_prefill=share)
        assert prefill_rows[0] == ((3 if share else 9), 7)  # the prompts' columns, once per prompt when shared
        assert all(shape[0] <= 9 and shape[1] == 1 for shape in prefill_rows[1:])  # one token per live row
    hook.remove()
    assert torch.equal(out[True][0], out[False][0])
    torch.testing.assert_close(out[True][1], out[False][1], atol=1e-12, rtol=0)
    assert not torch.equal(out[True][0][0], out[True][0][1])  # the group's rows drew their own samples


def test_rows_that_stopped_leave_the_batch_and_the_others_draw_what_they_drew_in_it(tiny_llama):
    model = tiny_llama.double().eval()  # fp64: the smaller batches round alike, so the draws are equal
    with torch.no_grad():  # EOS after a few tokens, at different steps in different rows
        model.lm_head.weight[EOS] = 0.0
        model.lm_head.weight[EOS, :4] = 1.0
    ids, mask = _prompts()
    ids, mask = ids.repeat(3, 1), mask.repeat(3, 1)  # 9 rows, not adjacent repeats: no shared prefill
    rows = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]),
                                           with_kwargs=True)
    out = {}
    for synced in (False, True):  # synced (a collective forward) keeps every row in the batch
        rows.clear()
        torch.manual_seed(2)
        out[synced] = sample_with_logprobs(model, ids, mask, max_new_tokens=30, temperature=1.0,
                                           eos_token_ids=[EOS], pad_token_id=PAD, synced=synced)
        steps = list(rows)
    hook.remove()
    sampled, logprobs = out[False]
    assert torch.equal(sampled, out[True][0])
    torch.testing.assert_close(logprobs, out[True][1], atol=1e-12, rtol=0)
    stop = torch.where((sampled == EOS).any(1), (sampled == EOS).int().argmax(1), sampled.shape[1])
    assert int(stop.min()) < int(stop.max())  # rows stop at different steps
    assert steps == [9] * len(steps)  # the synced run's decode steps: every row
    torch.manual_seed(2)
    rows.clear()
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]),
                                           with_kwargs=True)
    sample_with_logprobs(model, ids, mask, max_new_tokens=30, temperature=1.0, eos_token_ids=[EOS], pad_token_id=PAD)
    hook.remove()
    # the prefill (9 rows), then decode step t (feeding token t) runs the rows that had not stopped by token t
    assert rows == [9] + [int((stop > t).sum()) for t in range(len(rows) - 1)]
    for row, end in enumerate(stop.tolist()):  # after its stop: pads of log-prob 0
        assert (sampled[row, end + 1:] == PAD).all() and (logprobs[row, end + 1:] == 0).all()
