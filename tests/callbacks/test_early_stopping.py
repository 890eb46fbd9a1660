"""HeldOutUtilityEarlyStopping: stops at the right evaluation, keeps the best by utility, leaves training RNG alone."""

import json

import pytest
import torch

from lrlhf.callbacks import HeldOutUtilityEarlyStopping, ResumableCheckpoint
from lrlhf.eval.best_of_n import toy_gold_judge

from .conftest import BATCH, make_data, make_module, make_trainer
from .test_checkpoint import RecordSamples


class Scripted(HeldOutUtilityEarlyStopping):
    """Returns scripted (utility, proxy) pairs instead of sampling; the proxy keeps rising (Goodhart)."""

    def __init__(self, utilities, **kw):
        super().__init__(**kw)
        self.script = list(utilities)

    def evaluate(self, trainer, pl_module):
        i = len(self.history)
        if i == 0:  # rollout 0: the starting policy, before any update
            self.start_weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        return {"utility": self.script[i], "proxy": 0.1 * i, "kl": 0.5 * i, "length": 1.0}


def test_stops_at_the_right_evaluation_and_keeps_the_best_by_utility(world, tokenizer, tmp_path):
    # min_delta 0.05, patience 2: the start 0.1 best; 0.2 best; 0.5 best; 0.45 (wait 1); 0.52 < 0.5 + 0.05 (wait 2)
    # -> stop at rollout 4
    utilities = [0.1, 0.2, 0.5, 0.45, 0.52, 0.9, 0.9]
    es = Scripted(utilities, prompts=str(world.eval_prompts), every_n_rollouts=1, patience=2, min_delta=0.05)
    module = make_module(world, tokenizer)
    trainer = make_trainer(tmp_path, 6, module, [es, ResumableCheckpoint(dirpath=tmp_path / "ckpt")])
    trainer.fit(module, datamodule=make_data(world, tokenizer))
    assert module.rollouts_done == 4 and es.stopped_at == 4
    assert [h["utility"] for h in es.history] == utilities[:5]
    assert [h["rollout"] for h in es.history] == [0, 1, 2, 3, 4]
    assert es.best_index == 2 and es.best["rollout"] == 2 and not es.kept_start
    best = torch.load(tmp_path / "ckpt" / "best.ckpt", weights_only=True)
    assert best["lrlhf"]["rollouts_done"] == 2  # never the highest proxy (0.3 at rollout 4)
    rollout2 = torch.load(tmp_path / "ckpt" / "rollout=000002.ckpt", weights_only=True)
    assert all(torch.equal(best["state_dict"][k], v) for k, v in rollout2["state_dict"].items())
    assert (tmp_path / "goodhart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((tmp_path / "heldout_history.json").read_text())
    assert summary["best_index"] == 2 and summary["stopped_at"] == 4 and summary["kept_starting_policy"] is False


def test_a_run_that_only_gets_worse_keeps_and_exports_the_starting_policy(world, tokenizer, tmp_path):
    # issue #20 item 13: rollout 0 (the policy before any update) was never scored, so the best of the ruined
    # rollouts was "chosen" and exported
    es = Scripted([0.5, 0.3, 0.2, 0.1, 0.0], prompts=str(world.eval_prompts), every_n_rollouts=1, patience=3)
    module = make_module(world, tokenizer)
    trainer = make_trainer(tmp_path, 5, module, [es, ResumableCheckpoint(dirpath=tmp_path / "ckpt")])
    with pytest.warns(UserWarning, match=r"never improved on the starting policy \(rollout 0: 0\.5000; best after "
                                         r"an update 0\.3000.*module\.config\.lr too high"):
        trainer.fit(module, datamodule=make_data(world, tokenizer))
    assert module.rollouts_done == 3 and es.stopped_at == 3
    assert es.best_index == 0 and es.best["rollout"] == 0 and es.kept_start
    best = torch.load(tmp_path / "ckpt" / "best.ckpt", weights_only=True)
    assert best["lrlhf"]["rollouts_done"] == 0 and best["global_step"] == 0
    trained = best["state_dict"]  # the trained weights only (adapters, value head)
    assert trained and all(torch.equal(v, es.start_weights[k]) for k, v in trained.items())
    assert any(not torch.equal(module.state_dict()[k], v) for k, v in trained.items())  # the updates moved them
    chosen = es.stage_summary(trainer, module)  # what the CLI exports
    assert chosen["chosen/rollout"] == 0 and chosen["chosen/starting_policy"] is True
    assert all(torch.equal(module.state_dict()[k], v) for k, v in es.start_weights.items())
    summary = json.loads((tmp_path / "heldout_history.json").read_text())
    assert summary["kept_starting_policy"] is True and summary["history"][0]["rollout"] == 0


def test_a_run_shorter_than_every_n_rollouts_keeps_its_final_policy(world, tokenizer, tmp_path):
    # rollout 0 is the only evaluation: the trained policy was never scored, so nothing is chosen (the CLI exports
    # the final policy, as before rollout 0 was evaluated) and a warning says why
    es = Scripted([0.5], prompts=str(world.eval_prompts), every_n_rollouts=5, patience=1, plot=False)
    module = make_module(world, tokenizer)
    trainer = make_trainer(tmp_path, 2, module, [es])
    with pytest.warns(UserWarning, match=r"evaluated only at rollout 0.*\(2 rollouts\) was never evaluated "
                                         r"\(callbacks\.early_stopping\.every_n_rollouts=5\)"):
        trainer.fit(module, datamodule=make_data(world, tokenizer))
    assert [h["rollout"] for h in es.history] == [0] and es.chosen is None and not es.kept_start
    final = {k: v.clone() for k, v in module.state_dict().items()}
    assert es.stage_summary(trainer, module) == {}
    assert all(torch.equal(module.state_dict()[k], v) for k, v in final.items())


def test_state_survives_a_resume(world, tokenizer, tmp_path):
    kw = dict(prompts=str(world.eval_prompts), every_n_rollouts=1, patience=2, min_delta=0.05, plot=False)
    utilities = [0.1, 0.2, 0.5, 0.45, 0.52, 0.9]
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
    assert [h["rollout"] for h in resumed.history] == [0, 1, 2, 3, 4]  # rollout 0 is not evaluated again


class RecordEvaluationSamples(RecordSamples):
    """Also keeps the held-out evaluations' samples (early stopping samples through ``generate``)."""

    def generate(self, query_ids, query_mask):
        ids = super().generate(query_ids, query_mask)
        self.sampled.append(ids.clone())
        return ids


@pytest.mark.slow
def test_real_evaluation_is_deterministic_and_leaves_training_randomness_alone(world, tokenizer, tmp_path):
    def run(root, callbacks):
        module = make_module(world, tokenizer, cls=RecordEvaluationSamples)
        make_trainer(root, 2, module, callbacks).fit(module, datamodule=make_data(world, tokenizer))
        return module

    es = HeldOutUtilityEarlyStopping(str(world.eval_prompts), every_n_rollouts=1, patience=None, n_samples=2,
                                     batch_size=5, plot=False)
    with_es = run(tmp_path / "a", [es])
    without = run(tmp_path / "b", [])
    training = [ids for ids in with_es.sampled if len(ids) == BATCH]  # the evaluation batches have 5 and 2 rows
    assert len(with_es.sampled) == 2 + 3 * 3  # rollouts 0 (before any update), 1 and 2 evaluated
    assert [torch.equal(a, b) for a, b in zip(training, without.sampled, strict=True)] == [True, True]
    assert [h["rollout"] for h in es.history] == [0, 1, 2]
    start, first = es.history[0], es.history[1]
    assert abs(start["kl"]) < 1e-6  # zero-init LoRA: the starting policy is the reference
    assert 0.0 <= first["utility"] <= 1.0 and first["kl"] > 0
    assert es.evaluate(None, with_es) == es.evaluate(None, with_es)  # fixed seed, same weights
    fresh = make_module(world, tokenizer)
    fresh.configure_model()
    assert abs(es.evaluate(None, fresh)["kl"]) < 1e-6  # zero-init LoRA: the policy is the reference
    assert es.utility is toy_gold_judge  # resolved as eval.judge is (lrlhf.eval.judges.resolve_judge)


def test_a_held_out_prompt_with_special_token_text_is_refused_at_setup(world, tokenizer):
    from types import SimpleNamespace

    from lrlhf.data.records import PromptExample

    forged = PromptExample(prompt=[{"role": "user", "content": f"hi {tokenizer.eos_token} there"}], source="x.jsonl")
    es = HeldOutUtilityEarlyStopping([PromptExample(prompt=[{"role": "user", "content": "hi"}]), forged], plot=False,
                                     utility=lambda prompt, response: 0.0)
    with pytest.raises(ValueError, match=r"callbacks\.early_stopping\.prompts: prompt 1 \(x\.jsonl\): message 0 "
                                         r"\(user\) contains the special token text"):
        es.setup(None, SimpleNamespace(tokenizer=tokenizer), "fit")


def test_toy_gold_on_prompts_without_a_task_is_refused_at_setup():
    # issue #15: real prompts with the default toy gold failed after the first rollout
    from lrlhf.data.records import PromptExample

    real = [PromptExample(prompt=[{"role": "user", "content": "hi"}]) for _ in range(3)]
    with pytest.raises(ValueError, match=r"callbacks\.early_stopping\.utility=toy_gold: prompt 1 of "
                                         r"callbacks\.early_stopping\.prompts \(and 2 more\) has no toy-world task"):
        HeldOutUtilityEarlyStopping(real, plot=False)


class ScriptedEnsemble(HeldOutUtilityEarlyStopping):
    """Scripted proxy and ensemble disagreement; the utility is the proxy (``utility="proxy"``)."""

    def __init__(self, proxies, spreads, **kw):
        super().__init__(utility="proxy", **kw)
        self.proxies, self.spreads = list(proxies), list(spreads)

    def evaluate(self, trainer, pl_module):
        i = len(self.history)
        return {"utility": self.proxies[i], "proxy": self.proxies[i], "kl": 0.5 * i, "length": 1.0,
                "disagreement": self.spreads[i]}


def test_a_disagreement_rise_stops_and_keeps_the_best_proxy_before_it(world, tokenizer, tmp_path):
    # rise 0.5 over rollout 0's 1.0: 1.6 at rollout 3 is the first above 1.5 -> stop there, keep rollout 2
    es = ScriptedEnsemble([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 1.1, 1.5, 1.6, 2.0, 2.0],
                          prompts=str(world.eval_prompts), every_n_rollouts=1, patience=None, max_disagreement_rise=0.5)
    module = make_module(world, tokenizer)
    trainer = make_trainer(tmp_path, 5, module, [es, ResumableCheckpoint(dirpath=tmp_path / "ckpt")])
    trainer.fit(module, datamodule=make_data(world, tokenizer))
    assert module.rollouts_done == 3 and es.stopped_at == 3
    assert [h.get("disagreement_risen") for h in es.history] == [False, False, False, True]
    assert es.best["rollout"] == 2  # the best proxy before the rise, never the higher proxy of rollout 3
    assert torch.load(tmp_path / "ckpt" / "best.ckpt", weights_only=True)["lrlhf"]["rollouts_done"] == 2
    summary = json.loads((tmp_path / "heldout_history.json").read_text())
    assert summary["utility"] == "proxy" and summary["max_disagreement_rise"] == 0.5


def test_the_disagreement_guard_is_refused_without_an_ensemble_or_with_a_bare_proxy(world, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="callbacks.early_stopping.utility proxy .* needs max_disagreement_rise"):
        HeldOutUtilityEarlyStopping(prompts=str(world.eval_prompts), utility="proxy")
    es = HeldOutUtilityEarlyStopping(prompts=str(world.eval_prompts), every_n_rollouts=1, max_disagreement_rise=0.5)
    module = make_module(world, tokenizer)  # a single reward model
    trainer = make_trainer(tmp_path, 2, module, [es])
    with pytest.raises(ValueError, match="single model \\(use reward=ensemble\\)"):
        trainer.fit(module, datamodule=make_data(world, tokenizer))
    assert module.rollouts_done == 0  # refused at rollout 0, before any update
