import pytest
import torch

from lrlhf.models import ScalarHead, ScalarModel, last_token_index


def test_last_token_index_left_and_right_padding():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [2, 4, 4]
    with pytest.raises(ValueError, match="no attended token"):
        last_token_index(torch.tensor([[0, 0]]))


def test_head_init():
    torch.manual_seed(0)
    head = ScalarHead(4096)
    assert head.linear.weight.std().item() == pytest.approx((1 / 4097) ** 0.5, rel=0.05)
    assert (head.linear.bias == 0).all()
    assert (ScalarHead(8, zero_init=True)(torch.randn(3, 5, 8)) == 0).all()


def test_score_is_padding_invariant(tiny_model):
    model = ScalarModel(tiny_model).eval()
    seq = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        alone = model.score(seq, torch.ones_like(seq))
        right = model.score(torch.tensor([[5, 6, 7, 8, 0, 0]]), torch.tensor([[1, 1, 1, 1, 0, 0]]))
        left = model.score(torch.tensor([[0, 0, 5, 6, 7, 8]]), torch.tensor([[0, 0, 1, 1, 1, 1]]))
        values = model(seq, torch.ones_like(seq))
    # padding changes the attention kernels' reduction lengths: equal to fp32 accuracy
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=1e-5)
    assert values.shape == (1, 4)
    torch.testing.assert_close(values[:, -1], alone, atol=1e-5, rtol=1e-5)
