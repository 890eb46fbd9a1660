"""KTO (#36 item 5): the loss against TRL's KTOTrainer (its formula in fp64 here; TRL's own code when installed),
the mismatched sequences of the data, and the module's loss from log-probs computed independently."""

import copy
import json
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from oracles import require_oracle

from lrlhf.data.kto import KTODataModule, unpaired
from lrlhf.data.records import PreferencePair, Ranking, UnpairedExample
from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.functional import kto_loss
from lrlhf.models import LoraSpec, ModelConfig, reference_mode
from lrlhf.modules import KTOConfig, KTOModule


def _trl_kto_loss(policy, ref, policy_kl, ref_kl, labels, beta, w_d, w_u):
    """TRL 1.12 ``KTOTrainer._compute_loss`` (trl/trainer/kto_trainer.py, loss_type "kto"), transcribed: the
    answers split by label with index_select, the KL term the clamped mean over the mismatched rows, the losses
    concatenated desirable first and averaged (``nanmean``)."""
    chosen_idx = torch.nonzero(labels, as_tuple=False).view(-1)
    rejected_idx = torch.nonzero(~labels, as_tuple=False).view(-1)
    kl = (policy_kl - ref_kl).mean().detach().clamp(min=0)
    chosen_logratios = policy.index_select(0, chosen_idx) - ref.index_select(0, chosen_idx)
    rejected_logratios = policy.index_select(0, rejected_idx) - ref.index_select(0, rejected_idx)
    chosen_losses = 1 - torch.sigmoid(beta * (chosen_logratios - kl))
    rejected_losses = 1 - torch.sigmoid(beta * (kl - rejected_logratios))
    return torch.cat((w_d * chosen_losses, w_u * rejected_losses), 0).nanmean()


def test_kto_loss_is_trls_in_fp64_and_a_hand_computed_case():
    g = torch.Generator().manual_seed(0)
    for b in (1, 2, 7):
        policy, ref, policy_kl, ref_kl = (torch.randn(b, generator=g, dtype=torch.float64) * 3 for _ in range(4))
        labels = torch.rand(b, generator=g) > 0.4
        for beta, w_d, w_u in ((0.1, 1.0, 1.0), (0.5, 1.33, 0.8)):
            ours, _ = kto_loss(policy, ref, policy_kl, ref_kl, labels, beta, w_d, w_u)
            theirs = _trl_kto_loss(policy, ref, policy_kl, ref_kl, labels, beta, w_d, w_u)
            assert abs(ours.item() - theirs.item()) < 1e-12
    # by hand: z0 = max(0, mean([1 - 0, 0 - 3])) = max(0, -1) = 0; r = [2, -1]; beta 1
    # desirable 1 - sigmoid(2) = 0.119203; undesirable 1 - sigmoid(0 - (-1)) = 0.268941; mean 0.194072
    loss, stats = kto_loss(torch.tensor([2.0, -1.0]), torch.zeros(2), torch.tensor([1.0, 0.0]),
                           torch.tensor([0.0, 3.0]), torch.tensor([True, False]), beta=1.0)
    assert loss.item() == pytest.approx(0.194072, abs=1e-6) and stats.kl.item() == 0.0
    # a positive reference point moves both: z0 = 1
    loss, stats = kto_loss(torch.tensor([2.0, -1.0]), torch.zeros(2), torch.tensor([2.0, 0.0]), torch.zeros(2),
                           torch.tensor([True, False]), beta=1.0)
    assert stats.kl.item() == 1.0
    assert loss.item() == pytest.approx(((1 - torch.sigmoid(torch.tensor(1.0))) + (1 - torch.sigmoid(
        torch.tensor(2.0)))).item() / 2, abs=1e-7)


def test_kto_loss_gradient_reaches_the_answers_not_the_reference_point():
    policy = torch.tensor([0.5, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    policy_kl = torch.tensor([0.3, 0.1, 0.2], dtype=torch.float64, requires_grad=True)
    ref = torch.zeros(3, dtype=torch.float64)
    labels = torch.tensor([True, False, True])
    loss, stats = kto_loss(policy, ref, policy_kl, torch.zeros(3, dtype=torch.float64), labels, beta=0.5,
                           desirable_weight=2.0)
    loss.backward()
    assert policy_kl.grad is None  # the reference point is detached (TRL computes it under no_grad)
    z0, beta = stats.kl.item(), 0.5
    s = torch.sigmoid(beta * (policy.detach() - z0))
    # d/dr of w_d (1 - s(beta (r - z0))) = -w_d beta s (1 - s); of w_u (1 - s(beta (z0 - r))) = w_u beta s' (1 - s')
    s_bad = torch.sigmoid(beta * (z0 - policy.detach()))
    expected = torch.where(labels, -2.0 * beta * s * (1 - s), 1.0 * beta * s_bad * (1 - s_bad)) / 3
    assert torch.allclose(policy.grad, expected, atol=1e-12)
    with pytest.raises(ValueError, match="kto_loss: beta"):
        kto_loss(policy, ref, policy_kl, ref, labels, beta=0.0)


def test_pairs_and_rankings_become_one_desirable_and_one_undesirable_answer():
    user = [{"role": "user", "content": "q"}]
    a, b, c = ([{"role": "assistant", "content": t}] for t in "abc")
    records = [PreferencePair(user, a, b), PreferencePair(user, a, b, target=0.5), PreferencePair(user, a, b, 0.2),
               Ranking(user, [a, b, c], [2, 3, 1]), UnpairedExample(user, c, False)]
    got = [(u.completion[0]["content"], u.label) for u in unpaired(records)]
    assert got == [("a", True), ("b", False), ("b", True), ("a", False), ("c", True), ("b", False), ("c", False)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=4, sft_val=2, pref_train=6, pref_val=2, pref_test=2, rl=2, eval=2)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


def _kto_file(path, n=5):
    rows = [{"prompt": f"sort these numbers : {i} {i + 2} 1", "completion": f"1 {i} {i + 2}", "label": i % 2 == 0}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_kto_file_gives_each_prompt_its_answer_and_the_next_ones(world, tmp_path):
    dm = KTODataModule(str(world.tokenizer), train=str(_kto_file(tmp_path / "kto.jsonl")), batch_size=5,
                       max_length=64)
    dm.setup("fit")
    batch = dm.collate(dm.datasets["train"])  # dataset order
    tok = dm.tokenizer
    assert batch["input_ids"].shape[0] == 10 and batch["pair_targets"].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]

    def answer(row):
        return tok.decode(batch["input_ids"][row][batch["loss_mask"][row]], skip_special_tokens=True).strip()

    def prompt(row):
        return tok.decode(batch["input_ids"][row][batch["attention_mask"][row].bool() & ~batch["loss_mask"][row]])

    for i in range(5):
        assert answer(i) == f"1 {i} {i + 2}"
        assert answer(5 + i) == f"1 {(i + 1) % 5} {(i + 1) % 5 + 2}"  # the next example's answer (wraps)
        assert f": {i} {i + 2} 1" in prompt(5 + i)  # ... to this example's prompt


def _module(world):
    torch.manual_seed(0)
    module = KTOModule(ModelConfig(str(world.model)), config=KTOConfig(beta=0.3, lora=LoraSpec(r=4),
                                                                        desirable_weight=1.2))
    module.configure_model()
    for name, p in module.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.3)  # the policy differs from its reference
    module.log = lambda *a, **kw: None
    return module


def _row_logps(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
    logps = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return (logps * batch["loss_mask"][:, 1:]).sum(-1)


def test_the_module_loss_is_kto_on_log_probs_computed_by_hand(world, tmp_path):
    module = _module(world)
    dm = KTODataModule(str(world.tokenizer), train=str(_kto_file(tmp_path / "kto.jsonl")), batch_size=5,
                       max_length=64)
    dm.setup("fit")
    batch = dm.collate(dm.datasets["train"])
    loss = module.training_step(batch, 0)
    with torch.no_grad():
        policy = _row_logps(module.model, batch)
        with reference_mode(module.model):
            ref = _row_logps(module.model, batch)
    expected, _ = kto_loss(policy[:5], ref[:5], policy[5:], ref[5:], batch["pair_targets"] > 0.5, beta=0.3,
                           desirable_weight=1.2)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert (policy[:5] - ref[:5]).abs().max() > 1e-2  # the adapter moved the policy: the check has teeth


def test_kto_config_names_its_keys():
    with pytest.raises(ValueError, match="module.config.desirable_weight must be > 0"):
        KTOConfig(desirable_weight=0)
    with pytest.raises(ValueError, match="module.preference_loss is DPO's"):
        KTOModule("unused", config=KTOConfig(), preference_loss=object())


def test_the_loss_is_trls_own_when_trl_is_installed(world, tmp_path):
    """TRL's ``KTOTrainer._compute_loss`` itself on the same batch and models (the policy merged, the reference the
    base), as an oracle at 1e-6: ``pip install --no-deps trl==1.12.0`` runs it (CI does not install TRL)."""
    trl_kto = require_oracle("trl.trainer.kto_trainer")
    module = _module(world)
    dm = KTODataModule(str(world.tokenizer), train=str(_kto_file(tmp_path / "kto.jsonl")), batch_size=5,
                       max_length=64)
    dm.setup("fit")
    batch = dm.collate(dm.datasets["train"])
    ours = module.training_step(batch, 0).item()
    merged = copy.deepcopy(module.model).merge_and_unload()
    reference = copy.deepcopy(module.model).unload()  # the base without the adapter: our reference
    n = 5
    inputs = {"input_ids": batch["input_ids"][:n], "attention_mask": batch["attention_mask"][:n],
              "completion_mask": batch["loss_mask"][:n].long(), "KL_input_ids": batch["input_ids"][n:],
              "KL_attention_mask": batch["attention_mask"][n:], "KL_completion_mask": batch["loss_mask"][n:].long(),
              "label": batch["pair_targets"] > 0.5}
    accelerator = SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x,
                                  unwrap_model=lambda m: m)
    stub = SimpleNamespace(model=merged.train(), ref_model=reference.eval(), accelerator=accelerator,
                           aux_loss_enabled=False, precompute_ref_logps=False, calculate_KL=True, loss_type="kto",
                           beta=0.3, desirable_weight=1.2, undesirable_weight=1.0, use_liger_kernel=False,
                           _is_vlm=False, _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
                           _total_train_tokens=0, args=SimpleNamespace(gradient_checkpointing_kwargs=None))
    stub._compute_kl_logps = trl_kto.KTOTrainer._compute_kl_logps.__get__(stub)
    theirs = trl_kto.KTOTrainer._compute_loss(stub, merged, inputs, False).item()
    assert abs(ours - theirs) < 1e-6, (ours, theirs)
