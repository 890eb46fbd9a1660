import math

import pytest
import torch

from lrlhf.functional import entropy_from_logits, token_logprobs

U = 2.0**-24  # fp32 unit roundoff


def _log_softmax_rounding(z):
    """Bound on fp32's error in ``log_softmax(z)`` at each position (``z``: the fp64 scaled logits, ``(..., V)``).

    ``z_t - max - log(sum_v exp(z_v - max))``: every logit, the max, the log-sum-exp and the result round by u
    times their size, the sum of V exponentials (each <= 1) by up to (V + 2) u, which the log passes on as an
    absolute error. Different kernels (logsumexp vs log_softmax, AVX2 vs AVX-512 reduction orders) each stay
    within it.
    """
    return U * (4 * z.abs().amax(-1) + 2 * torch.logsumexp(z, -1).abs() + z.shape[-1] + 4)


def test_token_logprobs_by_hand_with_temperature():
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0]]))
    # T = 1: probs 1/6, 2/6, 3/6 -> token 2 has log(1/2)
    assert token_logprobs(logits, torch.tensor([2])).item() == pytest.approx(math.log(0.5), abs=1e-6)
    # T = 0.5: logits / T = log([1, 4, 9]) -> probs 1/14, 4/14, 9/14 -> token 1 has log(4/14)
    out = token_logprobs(logits, torch.tensor([1]), temperature=0.5)
    assert out.item() == pytest.approx(math.log(4 / 14), abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("chunk_rows", [1, 3, 512])
def test_token_logprobs_equals_log_softmax_gather(temperature, chunk_rows):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g) * 4
    tokens = torch.randint(0, 11, (2, 5), generator=g)
    z = logits.double() / temperature  # the expectation in fp64, from the same fp32 logits
    expected = torch.log_softmax(z, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    out = token_logprobs(logits, tokens, temperature=temperature, chunk_rows=chunk_rows)
    # |z| reaches ~40 here (log-probs -20, one fp32 ulp 1.9e-6): the bound scales with it
    assert ((out.double() - expected).abs() <= 2 * _log_softmax_rounding(z)).all()


def test_token_logprobs_upcasts_bf16_to_fp32():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 4, 9, generator=g) * 3).bfloat16()
    tokens = torch.randint(0, 9, (3, 4), generator=g)
    out = token_logprobs(logits, tokens, temperature=0.7)
    assert out.dtype == torch.float32
    z = logits.double() / 0.7  # bf16 values are exact in fp64: an fp32 computation stays within the fp32 bound
    expected = torch.log_softmax(z, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    assert ((out.double() - expected).abs() <= 2 * _log_softmax_rounding(z)).all()  # bf16 math would be ~1e-2 off


def test_token_logprobs_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64).requires_grad_()
    tokens = torch.randint(0, 5, (2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda z: token_logprobs(z, tokens, temperature=0.8, chunk_rows=2), (logits,))
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, temperature=0.8, chunk_rows=2), (logits,))


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_token_logprobs_gradient_chunk_by_chunk_equals_log_softmax_s_and_leaves_the_logits_alone(temperature):
    """The chunked backward (every chunk size, one that does not divide the rows too) gives autograd's gradient of
    ``log_softmax(z / T)[t]`` through a non-trivial upstream gradient, in the logits' dtype, and writes nothing into
    the logits (at T = 1 a chunk of fp32 logits is the logits themselves)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 7, (3, 5), generator=g)
    upstream = torch.randn(3, 5, generator=g, dtype=torch.float64)
    ref = logits.clone().requires_grad_()
    (torch.log_softmax(ref / temperature, -1).gather(-1, tokens[..., None]).squeeze(-1) * upstream).sum().backward()
    assert torch.autograd.gradcheck(lambda z: token_logprobs(z, tokens, temperature, chunk_rows=4),
                                    (logits.clone().requires_grad_(),))
    for chunk_rows in (1, 4, 15, 512):
        mine = logits.clone().requires_grad_()
        (token_logprobs(mine, tokens, temperature, chunk_rows=chunk_rows) * upstream).sum().backward()
        torch.testing.assert_close(mine.grad, ref.grad, rtol=0, atol=1e-12)
        assert torch.equal(mine.detach(), logits)
    single = logits.float().requires_grad_()
    (token_logprobs(single, tokens, temperature, chunk_rows=4) * upstream.float()).sum().backward()
    assert torch.equal(single.detach(), logits.float())  # fp32 at T = 1: the chunk aliased the logits
    bf16 = logits.bfloat16().requires_grad_()
    token_logprobs(bf16, tokens, temperature).sum().backward()
    assert bf16.grad.dtype == torch.bfloat16


def test_token_logprobs_shape_mismatch_and_bad_temperature():
    with pytest.raises(ValueError, match="do not align"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), temperature=0.0)


def test_entropy_by_hand():
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]))
    p = [1 / 6, 2 / 6, 3 / 6]
    expected = [-sum(q * math.log(q) for q in p), math.log(3)]
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor(expected), atol=1e-6, rtol=0)


def test_entropy_matches_categorical_with_temperature():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 13, generator=g) * 3
    z = logits.double() / 0.6
    expected = torch.distributions.Categorical(logits=z).entropy()  # fp64
    # fp32: each log p_v off by at most e (the log_softmax bound), p_v by e relative, then a sum of V terms:
    # |H32 - H| <= e (1 + H) + V u H
    e = _log_softmax_rounding(z)
    tol = 2 * (e * (1 + expected) + z.shape[-1] * U * expected)
    assert ((entropy_from_logits(logits, 0.6, chunk_rows=3).double() - expected).abs() <= tol).all()
