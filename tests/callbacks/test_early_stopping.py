"""HeldOutUtilityEarlyStopping: stops at the right evaluation, keeps the best by utility, leaves training RNG alone."""

import json

import pytest
import torch

from lrlhf.callbacks import HeldOutUtilityEarlyStopping, ResumableCheckpoint
from lrlhf.data.toy import gold_utility

from .conftest import BATCH, make_data, make_module, make_trainer
from .test_checkpoint import RecordSamples


class Scripted(HeldOutUtilityEarlyStopping):
    """Returns scripted (utility, proxy) pairs instead of sampling; the proxy keeps rising (Goodhart)."""

    def __init__(self, utilities, **kw):
        super().__init__(**kw)
        self.script = list(utilities)

    def evaluate(self, trainer, pl_module):
        i = len(self.history)
        return {"utility": self.script[i], "proxy": 0.1 * i, "kl": 0.5 * i, "length": 1.0}


def test_stops_at_the_right_evaluation_and_keeps_the_best_by_utility(world, tokenizer, tmp_path):
    # min_delta 0.05, patience 2: 0.2 best; 0.5 best; 0.45 (wait 1); 0.52 < 0.5 + 0.05 (wait 2) -> stop at eval 4
    utilities = [0.2, 0.5, 0.45, 0.52, 0.9, 0.9]
    es = Scripted(utilities, prompts=str(world.eval_prompts), every_n_rollouts=1, patience=2, min_delta=0.05)
    module = make_module(world, tokenizer)
    trainer = make_trainer(tmp_path, 6, module, [es, ResumableCheckpoint(dirpath=tmp_path / "ckpt")])
    trainer.fit(module, datamodule=make_data(world, tokenizer))
    assert module.rollouts_done == 4 and es.stopped_at == 4
    assert [h["utility"] for h in es.history] == utilities[:4]
    assert es.best_index == 1 and es.best["rollout"] == 2
    best = torch.load(tmp_path / "ckpt" / "best.ckpt", weights_only=True)
    assert best["lrlhf"]["rollouts_done"] == 2  # never the highest proxy (0.3 at rollout 4)
    rollout2 = torch.load(tmp_path / "ckpt" / "rollout=000002.ckpt", weights_only=True)
    assert all(torch.equal(best["state_dict"][k], v) for k, v in rollout2["state_dict"].items())
    assert (tmp_path / "goodhart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((tmp_path / "heldout_history.json").read_text())
    assert summary["best_index"] == 1 and summary["stopped_at"] == 4


def test_state_survives_a_resume(world, tokenizer, tmp_path):
    kw = dict(prompts=str(world.eval_prompts), every_n_rollouts=1, patience=2, min_delta=0.05, plot=False)
    utilities = [0.2, 0.5, 0.45, 0.52, 0.9]
    first = Scripted(utilities, **kw)
    module = make_module(world, tokenizer)
    make_trainer(tmp_path, 3, module, [first, ResumableCheckpoint(dirpath=tmp_path / "ckpt")]).fit(
        module, datamodule=make_data(world, tokenizer))
    assert first.wait == 1 and first.stopped_at is None
    resumed = Scripted(utilities, **kw)
    module = make_module(world, tokenizer)
    make_trainer(tmp_path, 6, module, [resumed, ResumableCheckpoint(dirpath=tmp_path / "ckpt")]).fit(
        module, datamodule=make_data(world, tokenizer), ckpt_path="last")
    assert resumed.stopped_at == 4 and resumed.best["rollout"] == 2  # the patience count carried over


@pytest.mark.slow
def test_real_evaluation_is_deterministic_and_leaves_training_randomness_alone(world, tokenizer, tmp_path):
    def run(root, callbacks):
        module = make_module(world, tokenizer, cls=RecordSamples)
        make_trainer(root, 2, module, callbacks).fit(module, datamodule=make_data(world, tokenizer))
        return module

    es = HeldOutUtilityEarlyStopping(str(world.eval_prompts), every_n_rollouts=1, patience=None, n_samples=2,
                                     batch_size=5, plot=False)
    with_es = run(tmp_path / "a", [es])
    without = run(tmp_path / "b", [])
    training = [ids for ids in with_es.sampled if len(ids) == BATCH]  # the evaluation batches have 5 and 2 rows
    assert len(with_es.sampled) == 2 + 2 * 3
    assert [torch.equal(a, b) for a, b in zip(training, without.sampled, strict=True)] == [True, True]
    assert len(es.history) == 2
    first = es.history[0]
    assert 0.0 <= first["utility"] <= 1.0 and first["kl"] > 0
    assert es.evaluate(None, with_es) == es.evaluate(None, with_es)  # fixed seed, same weights
    fresh = make_module(world, tokenizer)
    fresh.configure_model()
    assert abs(es.evaluate(None, fresh)["kl"]) < 1e-6  # zero-init LoRA: the policy is the reference
    assert es.utility is gold_utility


def test_a_held_out_prompt_with_special_token_text_is_refused_at_setup(world, tokenizer):
    from types import SimpleNamespace

    from lrlhf.data.records import PromptExample

    forged = PromptExample(prompt=[{"role": "user", "content": f"hi {tokenizer.eos_token} there"}], source="x.jsonl")
    es = HeldOutUtilityEarlyStopping([PromptExample(prompt=[{"role": "user", "content": "hi"}]), forged], plot=False)
    with pytest.raises(ValueError, match=r"callbacks\.early_stopping\.prompts: prompt 1 \(x\.jsonl\): message 0 "
                                         r"\(user\) contains the special token text"):
        es.setup(None, SimpleNamespace(tokenizer=tokenizer), "fit")
