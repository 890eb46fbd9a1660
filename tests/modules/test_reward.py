"""RewardModule: one forward per pair batch, BT / ranking losses by hand, validation metrics by hand, LoRA vs
full fine-tuning, a Trainer run on the toy world, export -> load, config validation."""

import json
import math
import warnings

import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM

from lrlhf.data.collate import pad_to_multiple
from lrlhf.data.datamodules import PreferenceDataModule
from lrlhf.data.shared_batches import unshare_batch
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.functional import margin_summary, ranking_loss
from lrlhf.models import LoraSpec, ModelConfig
from lrlhf.models.reward import CALIBRATION_FILE, HEAD_FILE, load_calibration, load_reward_model
from lrlhf.modules import RewardConfig, RewardModule, compute_calibration

VOCAB = 64


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      vocab_size=VOCAB, bos_token_id=1, eos_token_id=1, pad_token_id=0)
    return LlamaForCausalLM(cfg)


def pair_batch(b=3, t=6, seed=1):
    """B random pairs, right-padded rows of different lengths; the last pair is a tie."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, t + 1, (2 * b,), generator=g)
    ids = torch.randint(2, VOCAB, (2 * b, t), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    targets = torch.ones(b)
    targets[-1] = 0.5
    return {
        "input_ids": ids * mask, "attention_mask": mask, "lengths": lengths,
        "prompt_lengths": torch.full((2 * b,), 2), "pair_targets": targets,
        "sources": ["file"] * b, "meta": [{"task": {"kind": "sort"}}] * b,
    }


def bce(m, t):
    """-t log sigmoid(m) - (1 - t) log sigmoid(-m), by hand."""
    return t * math.log1p(math.exp(-m)) + (1 - t) * math.log1p(math.exp(m))


# ---------------------------------------------------------------------------------------------- forward / loss
def test_one_forward_for_chosen_and_rejected():
    module = RewardModule(tiny_llama())
    calls = []
    module.model.backbone.model.register_forward_hook(lambda mod, args, kwargs, out: calls.append(kwargs),
                                                      with_kwargs=True)
    batch = pair_batch(b=3)
    loss = module.training_step(batch, 0)
    assert len(calls) == 1 and calls[0]["input_ids"].shape[0] == 6  # chosen and rejected together
    assert loss.ndim == 0 and loss.requires_grad


def _loss_batch(b):
    return {"pair_targets": torch.tensor([1.0, 0.5]), "lengths": torch.full((2 * b,), 5),
            "prompt_lengths": torch.full((2 * b,), 2)}


def test_bradley_terry_loss_with_a_tie_by_hand():
    # chosen rewards (2, 0.5), rejected (1, 1.5): margins +1 (label) and -1 (tie, target 0.5)
    rewards = torch.tensor([2.0, 0.5, 1.0, 1.5])
    module = RewardModule(tiny_llama())
    out = module.compute_loss(rewards, _loss_batch(2))
    expected = (bce(1.0, 1.0) + bce(-1.0, 0.5)) / 2  # = (log(1+e^-1) + 0.5 log(1+e) + 0.5 log(1+e^-1)) / 2
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.pairs.chosen.tolist() == [2.0, 0.5] and out.pairs.rejected.tolist() == [1.0, 1.5]

    dropped = RewardModule(tiny_llama(), RewardConfig(ties="drop")).compute_loss(rewards, _loss_batch(2))
    assert dropped.loss.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-6)

    # centering adds c * mean(r^2) = 0.1 * (4 + 0.25 + 1 + 2.25) / 4
    centred = RewardModule(tiny_llama(), RewardConfig(center_coef=0.1)).compute_loss(rewards, _loss_batch(2))
    assert centred.loss.item() == pytest.approx(expected + 0.1 * 7.5 / 4, abs=1e-6)


def test_ranking_batch_averages_per_prompt():
    # prompt 0: three completions ranked 1, 2, 3 (3 pairs); prompt 1: two ranked 2, 1 (1 pair)
    rewards = torch.tensor([3.0, 1.0, 0.0, 0.5, 1.5])
    ranks = torch.tensor([1, 2, 3, 2, 1])
    group = torch.tensor([0, 0, 0, 1, 1])
    batch = {"ranks": ranks, "group": group, "lengths": torch.full((5,), 4), "prompt_lengths": torch.full((5,), 2)}
    out = RewardModule(tiny_llama()).compute_loss(rewards, batch)
    prompt0 = (bce(2.0, 1) + bce(3.0, 1) + bce(1.0, 1)) / 3
    prompt1 = bce(1.0, 1)
    assert out.loss.item() == pytest.approx((prompt0 + prompt1) / 2, abs=1e-6)
    assert out.loss.item() == pytest.approx(ranking_loss(rewards, ranks, group).item(), abs=1e-7)
    # as pairs, better first: margins 2, 3, 1 and 1.5 - 0.5 = 1
    assert (out.pairs.chosen - out.pairs.rejected).tolist() == [2.0, 3.0, 1.0, 1.0]


# ----------------------------------------------------------------------------------------------------- metrics
def _metrics(module):
    return {
        "accuracy": module.val_accuracy.compute().item(), "nll": module.val_nll.compute().item(),
        "ece": module.val_ece.compute().item(), "auroc": module.val_auroc.compute().item(),
        "buckets": {k: m.compute().item() for k, m in module.val_length_accuracy.items() if m.update_count},
        "sources": {module.source_names[k]: m.compute().item() for k, m in module.val_source_accuracy.items()},
        "corr": module.val_length_corr.compute().item(),
    }


def test_validation_metrics_on_hand_made_scores():
    # 5 pairs, the last a tie. margins: +2, -1, +0.5, +3, (tie) +1
    chosen = [2.0, 0.0, 1.0, 3.0, 1.0]
    rejected = [0.0, 1.0, 0.5, 0.0, 0.0]
    targets = [1.0, 1.0, 1.0, 1.0, 0.5]
    # completion lengths: chosen 9, 4, 5, 3, 4 against rejected 4, 4, 6, 8, 4 -> diffs +5, 0, -1, -5, 0
    chosen_len, rejected_len = [9, 4, 5, 3, 4], [4, 4, 6, 8, 4]
    kinds = ["sort", "count", "count", "sort", "sort"]
    batch = {
        "pair_targets": torch.tensor(targets), "lengths": torch.tensor(chosen_len + rejected_len) + 2,
        "prompt_lengths": torch.full((10,), 2), "sources": ["f"] * 5,
        "meta": [{"task": {"kind": k}} for k in kinds],
    }
    rewards = torch.tensor(chosen + rejected)
    module = RewardModule(tiny_llama(), RewardConfig(similar_length=1, calibration_bins=10))
    module.on_validation_epoch_start()
    out = module.compute_loss(rewards, batch)
    module.update_metrics(rewards, batch, out.pairs)
    got = _metrics(module)

    margins = [2.0, -1.0, 0.5, 3.0]  # labelled pairs only
    assert got["accuracy"] == pytest.approx(3 / 4, abs=1e-6)
    nll = (bce(2, 1) + bce(-1, 1) + bce(0.5, 1) + bce(3, 1) + bce(1, 0.5)) / 5  # ties included
    assert got["nll"] == pytest.approx(nll, abs=1e-6)
    # The A/B order from the same fixed generator: a flipped pair shows -margin with label 0.
    flips = (torch.rand(4, generator=torch.Generator().manual_seed(0)) < 0.5).tolist()
    shown = [-m if f else m for m, f in zip(margins, flips, strict=True)]
    labels = [0 if f else 1 for f in flips]
    probs = [1 / (1 + math.exp(-s)) for s in shown]
    ece = 0.0  # 10 uniform bins: sum over bins of |mean label - mean prob| * share
    for k in range(10):
        idx = [i for i, p in enumerate(probs) if k / 10 <= p < (k + 1) / 10]
        if idx:
            ece += abs(sum(labels[i] for i in idx) / len(idx) - sum(probs[i] for i in idx) / len(idx)) * len(idx) / 4
    assert got["ece"] == pytest.approx(ece, abs=1e-6)
    pos = [s for s, y in zip(shown, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(shown, labels, strict=True) if y == 0]
    assert pos and neg  # seed 0 flips pairs 0, 2, 3
    auroc = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))  # P(pos > neg)
    assert got["auroc"] == pytest.approx(auroc, abs=1e-6)
    # length buckets (similar = |diff| <= 1): longer {+5: correct}, similar {0: wrong, -1: correct},
    # shorter {-5: correct}
    assert got["buckets"] == pytest.approx({"chosen_longer": 1.0, "similar": 0.5, "chosen_shorter": 1.0}, abs=1e-6)
    # per source (task kind): sort pairs 0, 3 correct; count pairs 1 wrong, 2 right (the tie is not counted)
    assert got["sources"] == pytest.approx({"sort": 1.0, "count": 0.5}, abs=1e-6)
    # Pearson correlation of reward and completion length over all 10 completions
    lengths = chosen_len + rejected_len
    r = chosen + rejected
    mr, ml = sum(r) / 10, sum(lengths) / 10
    cov = sum((a - mr) * (b - ml) for a, b in zip(r, lengths, strict=True))
    corr = cov / math.sqrt(sum((a - mr) ** 2 for a in r) * sum((b - ml) ** 2 for b in lengths))
    assert got["corr"] == pytest.approx(corr, abs=1e-6)



def test_an_empty_length_bucket_or_source_is_not_logged_and_warns_nothing():
    # every pair's chosen answer is longer: the `similar` and `chosen_shorter` buckets are empty (they logged NaN
    # with torchmetrics' "compute before update" warning); a source all of whose pairs are ties has no accuracy
    rewards = torch.tensor([2.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # chosen 2, 0, 1, 0 | rejected 0, 1, 0, 0
    batch = {"pair_targets": torch.tensor([1.0, 1.0, 1.0, 0.5]), "prompt_lengths": torch.full((8,), 2),
             "lengths": torch.tensor([12, 12, 12, 12, 6, 6, 6, 6]), "sources": ["f"] * 4,
             "meta": [{"source": s} for s in ("a", "a", "a", "ties")]}
    module = RewardModule(tiny_llama(), RewardConfig(similar_length=1))
    module.register_sources(["a", "ties"])
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):  # a second epoch: the metrics were reset
            logged.clear()
            module.on_validation_epoch_start()
            module.update_metrics(rewards, batch, module.compute_loss(rewards, batch).pairs)
            module.on_validation_epoch_end()
            accuracies = {k: v for k, v in logged.items() if k.startswith("val/accuracy_")}
            assert accuracies == pytest.approx({"val/accuracy_chosen_longer": 2 / 3, "val/accuracy_source/a": 2 / 3})


def test_order_randomisation_gives_both_classes_and_auroc_of_a_perfect_ranker():
    # every labelled margin positive: chosen-first, AUROC would be undefined (no negatives)
    n = 64
    margins = torch.linspace(0.1, 3.0, n)
    rewards = torch.cat([margins, torch.zeros(n)])
    batch = {"pair_targets": torch.ones(n), "lengths": torch.full((2 * n,), 5),
             "prompt_lengths": torch.full((2 * n,), 2)}
    module = RewardModule(tiny_llama())
    module.on_validation_epoch_start()
    module.update_metrics(rewards, batch, module.compute_loss(rewards, batch).pairs)
    labels = torch.cat(module.val_auroc.target)
    assert 0 < labels.sum() < n  # both classes
    assert module.val_auroc.compute().item() == pytest.approx(1.0, abs=1e-6)  # a perfect ranker stays perfect
    first = labels.clone()
    module.val_auroc.reset()
    module.on_validation_epoch_start()  # the same flips every epoch
    module.update_metrics(rewards, batch, module.compute_loss(rewards, batch).pairs)
    assert torch.equal(torch.cat(module.val_auroc.target), first)


def test_margin_summary_by_hand():
    stats = margin_summary(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    # linear-interpolated quantiles: q05 = 1 + 0.05 * 4
    assert stats == pytest.approx({"mean": 3.0, "std": math.sqrt(2.5), "q05": 1.2, "q25": 2.0, "q50": 3.0,
                                   "q75": 4.0, "q95": 4.8}, abs=1e-6)


# ---------------------------------------------------------------------------------------- LoRA vs full FT
def _fit(module, steps=3):
    batches = [pair_batch(seed=s) for s in range(steps)]
    trainer = Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(batches, batch_size=None))


def _snapshot(module):
    return {k: v.detach().clone() for k, v in module.model.named_parameters()}


def test_lora_trains_adapter_and_head_only():
    module = RewardModule(tiny_llama(), RewardConfig(lr=1e-2, lora=LoraSpec(r=4)))
    before = _snapshot(module)
    _fit(module)
    changed = {k for k, v in module.model.named_parameters() if not torch.equal(v, before[k])}
    assert any("lora_" in k and ".reward." in k for k in changed)
    assert {"head.linear.weight", "head.linear.bias"} <= changed
    assert all("lora_" in k or k.startswith("head.") for k in changed)  # base weights unchanged


def test_full_fine_tune_changes_the_base():
    module = RewardModule(tiny_llama(), RewardConfig(lr=1e-2))
    before = _snapshot(module)
    _fit(module)
    base = "backbone.model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(module.model.get_parameter(base), before[base])


# ------------------------------------------------------------------------------------------------ toy world
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=4, sft_val=2, pref_train=16, pref_val=8, pref_test=4, rl=2, eval=2)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


def _datamodule(world, **kw):
    return PreferenceDataModule(str(world.tokenizer), train=str(world.pref_train), val=str(world.pref_val),
                                batch_size=4, max_length=96, **kw)


def test_trainer_fit_and_validate_on_the_toy_world(world):
    module = RewardModule(ModelConfig(str(world.model)), RewardConfig(lr=1e-3), tokenizer=world.tokenizer)
    trainer = Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    datamodule = _datamodule(world)
    trainer.fit(module, datamodule=datamodule)
    metrics = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    for key in ("val/loss", "val/accuracy", "val/nll", "val/ece", "val/auroc", "val/reward_length_corr",
                "val/margin_mean", "val/margin_std", "val/margin_q50", "val/accuracy_source/sort",
                "val/accuracy_source/count"):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert 0.0 <= metrics["val/accuracy"] <= 1.0


def test_a_source_file_name_with_dots_is_a_metric_name(world, tmp_path):
    # issue #15: per-source accuracy used the file name as a module key, and "module name can't contain '.'"
    lines = [json.loads(line) for line in world.pref_val.read_text().splitlines()]
    hh_test = tmp_path / "hh_test.v2.jsonl"
    hh_test.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "task"}) + "\n" for r in lines))
    module = RewardModule(ModelConfig(str(world.model)), RewardConfig(lr=1e-3), tokenizer=world.tokenizer)
    trainer = Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    data = PreferenceDataModule(str(world.tokenizer), train=str(world.pref_train), val=str(hh_test),
                                batch_size=4, max_length=96)
    trainer.fit(module, datamodule=data)
    metrics = trainer.validate(module, datamodule=data, verbose=False)[0]
    assert metrics[f"val/accuracy_source/{hh_test.name}"] == pytest.approx(metrics["val/accuracy"])


def test_held_out_accuracy_comes_with_its_interval_and_the_length_baselines(world):
    # issue #15: an RM that only learned "shorter wins" must be seen as such
    from lrlhf.modules.reward_eval import pairwise_baselines
    from lrlhf.modules.rm import completion_lengths

    module = RewardModule(ModelConfig(str(world.model)), RewardConfig(lr=1e-3), tokenizer=world.tokenizer)
    module.configure_model()
    data = _datamodule(world)
    data.setup("fit")
    # a scorer that prefers the shorter answer, nothing else
    out = pairwise_baselines([module.as_pairs(-completion_lengths(b).float(), b) for b in data.val_dataloader()])
    assert out["test/pair_accuracy"] == pytest.approx(out["test/shorter_wins"])
    assert out["test/longer_wins"] == pytest.approx(1 - out["test/shorter_wins"])
    lo, hi = out["test/accuracy_interval"]
    assert lo <= out["test/pair_accuracy"] <= hi
    labelled = [json.loads(line) for line in world.pref_val.read_text().splitlines()]
    assert out["test/pairs"] == sum(1 for r in labelled if r.get("target", 1.0) != 0.5)


def test_packed_pairs_score_like_padded_ones(world):
    module = RewardModule(ModelConfig(str(world.model), attn_implementation="sdpa")).eval()
    padded, packed = _datamodule(world), _datamodule(world, packing=True, pack_length=192)
    padded.setup("validate")
    packed.setup("validate")
    batch = next(iter(DataLoader(padded.datasets["val"], batch_size=16, collate_fn=padded.collate)))
    rows = packed.datasets["val"]
    packed_batch = packed.collate(rows)
    assert len(rows) < len(padded.datasets["val"])  # several pairs share a row
    # packing reorders pairs (first fit), so pairs are matched by their token ids
    with torch.no_grad():
        by_pair_padded = dict(zip(_keys(padded.datasets["val"]), module.score(batch).view(2, -1).T.tolist(),
                                  strict=True))
        by_pair_packed = dict(zip(_keys([p for row in rows for p in row]),
                                  module.score(packed_batch).view(2, -1).T.tolist(), strict=True))
    for key, scores in by_pair_padded.items():
        assert by_pair_packed[key] == pytest.approx(scores, abs=1e-5)


def _keys(pairs):
    return [(tuple(p.chosen.input_ids.tolist()), tuple(p.rejected.input_ids.tolist())) for p in pairs]


# ---------------------------------------------------------------------------------------------- export / load
def test_the_reward_artefact_names_stay_importable_from_modules():
    import lrlhf.models.reward as artefact
    import lrlhf.modules as modules
    import lrlhf.modules.rm as training

    for name in ("RewardCalibration", "load_calibration", "load_reward_model", "attach_reward_adapter"):
        assert getattr(modules, name) is getattr(training, name) is getattr(artefact, name)
    for name in ("CALIBRATION_FILE", "HEAD_FILE", "ADAPTER_NAME", "ADAPTER_DIR"):
        assert getattr(training, name) == getattr(artefact, name)


@pytest.mark.parametrize("lora", [None, LoraSpec(r=4)], ids=["full", "lora"])
def test_export_then_load_gives_the_same_scores(world, tmp_path, lora):
    module = RewardModule(ModelConfig(str(world.model)), RewardConfig(lr=1e-2, lora=lora), tokenizer=world.tokenizer)
    datamodule = _datamodule(world)
    trainer = Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    calibration = compute_calibration(module, datamodule, reference="pref_val")
    out = module.export(tmp_path / "rm")
    assert (out / HEAD_FILE).is_file() and (out / CALIBRATION_FILE).is_file()
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()

    loaded = load_reward_model(out)
    batch = unshare_batch(next(iter(datamodule.val_dataloader())))  # the padded layout, as the loaded model takes
    module.eval()
    with torch.no_grad():
        expected, got = module.score(batch), loaded.score(batch["input_ids"], batch["attention_mask"])
    if lora is None:
        assert torch.equal(got, expected)
    else:  # merging W + (alpha/r) B A rounds differently from applying the adapter on the fly
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)

    saved = load_calibration(out)
    assert saved == calibration and json.loads((out / CALIBRATION_FILE).read_text())["reference"] == "pref_val"
    # the frozen normalisation: the reference completions' rewards have mean 0, std 1 afterwards
    with torch.no_grad():
        rewards = torch.cat([loaded.score(b["input_ids"], b["attention_mask"])
                             for b in map(unshare_batch, datamodule.val_dataloader())])
    normalised = saved.normalise(rewards)
    assert normalised.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert normalised.std().item() == pytest.approx(1.0, abs=1e-5)


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kwargs, key",
    [({"lr": 0.0}, "module.config.lr"), ({"weight_decay": -1.0}, "module.config.weight_decay"),
     ({"betas": (0.9, 1.0)}, "module.config.betas"), ({"eps": 0.0}, "module.config.eps"),
     ({"warmup_steps": -1}, "module.config.warmup_steps"), ({"scheduler": "step"}, "module.config.scheduler"),
     ({"head_init": "xavier"}, "module.config.head_init"), ({"center_coef": -0.1}, "module.config.center_coef"),
     ({"ties": "ignore"}, "module.config.ties"), ({"similar_length": -1}, "module.config.similar_length"),
     ({"calibration_bins": 0}, "module.config.calibration_bins"),
     ({"compile_pad_multiple": 0}, "module.config.compile_pad_multiple")],
)
def test_config_validation_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        RewardConfig(**kwargs)


def test_config_lora_from_a_dict_and_zero_head_init():
    cfg = RewardConfig(lora={"r": 2}, head_init="zero")
    assert cfg.lora == LoraSpec(r=2)
    module = RewardModule(tiny_llama(), cfg)
    assert module.model.head.linear.weight.abs().sum().item() == 0.0


# --------------------------------------------------------------------------------------- GGUF model
@pytest.mark.slow
def test_smollm2_gguf_lora_two_rm_steps(tmp_path, smollm2_config):
    from pathlib import Path

    from lrlhf.data.formats import load_records
    from lrlhf.data.records import PreferencePair

    hh = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"
    if hh.is_file():  # real preference pairs
        pairs, _ = load_records(str(hh), "preference", verbose=False)
        pairs = pairs[:4]
    else:  # an outside clone has no ../shared: a few hand-made pairs
        pairs = [PreferencePair([{"role": "user", "content": f"What is {n} + {n}?"}],
                                [{"role": "assistant", "content": str(2 * n)}],
                                [{"role": "assistant", "content": "I don't know."}]) for n in range(4)]
    from lrlhf.models import load_tokenizer

    tokenizer = load_tokenizer(smollm2_config)
    module = RewardModule(smollm2_config, RewardConfig(lr=1e-4, lora=LoraSpec(r=4)), tokenizer=tokenizer)
    data = PreferenceDataModule(tokenizer, train=pairs, batch_size=2, max_length=128, truncation="left")
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    trainer = Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)
    after = dict(module.model.named_parameters())
    assert trainer.global_step == 2 and math.isfinite(trainer.callback_metrics["train/loss"].item())
    backbone = [n for n in after if n.startswith("backbone.") and "lora_" not in n]
    assert backbone and all(torch.equal(after[n], before[n]) for n in backbone)
    assert any(not torch.equal(after[n], before[n]) for n in after if "lora_B" in n)
    assert not torch.equal(after["head.linear.weight"], before["head.linear.weight"])


# ---------------------------------------------------------------------------------------------- torch.compile
def test_pad_to_multiple_adds_masked_columns_and_keeps_the_rewards():
    batch = pair_batch(b=3, t=6)
    ids, mask = pad_to_multiple(batch["input_ids"], batch["attention_mask"], 8)
    assert ids.shape == mask.shape == (6, 8)
    assert torch.equal(ids[:, :6], batch["input_ids"]) and torch.equal(mask[:, :6], batch["attention_mask"])
    assert ids[:, 6:].eq(0).all() and mask[:, 6:].eq(0).all()
    assert pad_to_multiple(ids, mask, 4)[0] is ids  # already a multiple: unchanged
    module = RewardModule(tiny_llama())
    with torch.no_grad():
        torch.testing.assert_close(module.model.score(ids, mask), module.score(batch), rtol=0, atol=1e-6)


def _one_lora_step(compile_backbone: bool):
    """Rewards, loss and the trainable weights after one AdamW step of a LoRA RM on a fixed batch."""
    torch.manual_seed(0)
    config = RewardConfig(lr=1e-2, lora=LoraSpec(r=4), compile=compile_backbone, compile_pad_multiple=8)
    module = RewardModule(tiny_llama(), config)
    with torch.no_grad():  # LoRA B starts at 0: give the adapter a non-zero delta so its A gets gradients
        for name, param in module.model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))))
    optimizer = module.configure_optimizers()["optimizer"]
    batch = pair_batch(b=3, t=6)
    rewards = module.score(batch)
    loss = module.compute_loss(rewards, batch).loss
    loss.backward()
    optimizer.step()
    weights = {k: v.detach().clone() for k, v in module.model.named_parameters() if v.requires_grad}
    return rewards.detach(), loss.detach(), weights


def test_compiled_lora_step_matches_eager():
    """``compile=True`` (inductor, batch padded from 6 to 8 columns) gives the eager rewards and loss within
    1e-5 and the same weights after one AdamW step (lr 1e-2) within 1e-5."""
    from torch._dynamo.utils import counters

    eager = _one_lora_step(False)
    graphs = counters["stats"]["unique_graphs"]
    compiled = _one_lora_step(True)
    assert counters["stats"]["unique_graphs"] > graphs  # the forward really went through dynamo
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(compiled[1], eager[1], rtol=0, atol=1e-5)
    assert compiled[2].keys() == eager[2].keys() and any("lora_A" in k for k in eager[2])
    for name, weight in eager[2].items():
        torch.testing.assert_close(compiled[2][name], weight, rtol=0, atol=1e-5, msg=name)
