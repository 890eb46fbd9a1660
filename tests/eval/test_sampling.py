"""The evaluation's draws split over worker processes (``jobs=N``) are the draws of one process, bit for bit."""

import copy
import multiprocessing

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from lrlhf.data.formats import load_records
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.eval.sampling import Draw, Shared, draw_all
from lrlhf.models import ScalarModel
from lrlhf.models.generation import SamplingConfig
from lrlhf.models.reward import HEAD_FILE, RewardCalibration


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("draws")
    sizes = WorldSizes(sft_train=2, sft_val=2, pref_train=2, pref_val=2, pref_test=2, rl=2, eval=5)
    world = build_world(root / "world", seed=0, sizes=sizes)
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(world.model)
    policy = copy.deepcopy(reference)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    for name, model in (("reference", reference), ("policy", policy)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    rm = ScalarModel(copy.deepcopy(policy))  # as RewardModule.export writes it: the backbone, the head, calibration
    with torch.no_grad():
        for p in rm.head.parameters():
            p.normal_()  # not the zero-initialised head: each sample's proxy score its own
    rm.backbone.save_pretrained(root / "rm")
    tokenizer.save_pretrained(root / "rm")
    save_file(rm.head.state_dict(), root / "rm" / HEAD_FILE)
    RewardCalibration(mean=0.1, std=2.0, count=1).save(root / "rm")
    prompts = load_records(str(world.eval_prompts), "prompt", verbose=False)[0]
    return root, prompts


def _shared(root, prompts):
    return Shared(prompts, str(root / "reference"), str(root / "rm"), str(root / "rm"), batch_size=4)


@pytest.mark.slow
def test_draws_in_two_processes_are_the_draws_of_one(folders, capsys):
    root, prompts = folders
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.0, seed=3)
    draws = [Draw("sft", str(root / "reference"), 2, sampling), Draw("ppo", str(root / "policy"), 2, sampling),
             Draw("pool", str(root / "reference"), 6, SamplingConfig(10, 1.0, 4), kl=False)]
    scored = []
    one = dict(zip(["sft", "ppo", "pool"], draw_all(_shared(root, prompts), draws, workers=1), strict=True))
    two = dict(zip(["sft", "ppo", "pool"], draw_all(_shared(root, prompts), draws, workers=2,
                                                    then=lambda s: scored.append(s.name) or s), strict=True))
    assert "sampling sft, ppo, pool in 2 processes (jobs=2), the largest first" in capsys.readouterr().out
    assert [s.name for s in two.values()] == ["sft", "ppo", "pool"] and sorted(scored) == ["pool", "ppo", "sft"]
    for name, samples in one.items():
        for figure in ("texts", "lengths", "proxy", "kl", "ids"):
            assert getattr(two[name], figure) == getattr(samples, figure), (name, figure)
    assert any(k != 0.0 for row in two["ppo"].kl for k in row) and two["pool"].kl == [[0.0] * 6] * len(prompts)
    assert len({score for row in two["pool"].proxy for score in row}) > 1
    assert len(two["pool"].texts[0]) == 6


@pytest.mark.slow
def test_a_draw_that_fails_in_a_worker_stops_the_evaluation_naming_its_folder(folders):
    root, prompts = folders
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.0, seed=3)
    draws = [Draw("pool", str(root / "reference"), 400, sampling, kl=False),  # the long draw, started first
             Draw("gone", str(root / "no_such_policy"), 2, sampling)]
    with pytest.raises(Exception, match="no_such_policy"):
        draw_all(_shared(root, prompts), draws, workers=2)
    assert multiprocessing.active_children() == []  # the long draw's worker was stopped, not left running
