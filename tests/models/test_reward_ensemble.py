"""The reward-ensemble artefact: written from member folders, reloaded, scoring as its members say by hand."""

import json

import pytest
import torch

from lrlhf.data.toy import WorldSizes, build_world
from lrlhf.functional import EnsembleMean, MeanMinusStd, WorstCase
from lrlhf.models import ModelConfig, load_reward_model
from lrlhf.models.ensemble import ENSEMBLE_FILE, RewardEnsembleModel, load_reward_ensemble, write_ensemble
from lrlhf.models.reward import RewardCalibration, load_calibration
from lrlhf.modules import RewardConfig, RewardModule


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = WorldSizes(sft_train=2, sft_val=2, pref_train=2, pref_val=2, pref_test=2, rl=2, eval=2)
    return build_world(tmp_path_factory.mktemp("toy"), seed=0, sizes=sizes)


@pytest.fixture(scope="module")
def members(world, tmp_path_factory):
    """Three reward-model folders: the toy model with another random head each and its own calibration."""
    root = tmp_path_factory.mktemp("members")
    folders = []
    for i in range(3):
        torch.manual_seed(10 + i)
        module = RewardModule(ModelConfig(str(world.model)), RewardConfig(), tokenizer=world.tokenizer)
        module.configure_model()
        with torch.no_grad():
            module.model.head.linear.weight.normal_(0, 1.0)
        module.calibration = RewardCalibration(mean=0.5 * i, std=1.0 + i, count=8, reference="test")
        folders.append(module.export(root / f"m{i}"))
    return folders


def _batch(world):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(world.tokenizer))
    enc = tok(["sort these numbers : 3 1 2", "how many items : cat dog", "sure 1 2 3"], padding=True,
              return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def test_the_artefact_reloads_and_scores_as_its_calibrated_members(world, members, tmp_path):
    folder = write_ensemble(tmp_path / "ens", members, MeanMinusStd(0.5))
    spec = json.loads((folder / ENSEMBLE_FILE).read_text())
    assert spec["combine"] == {"_target_": "lrlhf.functional.ensemble_rules.MeanMinusStd", "coef": 0.5}
    assert all(not m.startswith("/") for m in spec["members"])  # relative: the stage folder moves whole
    assert load_calibration(folder) == RewardCalibration(0.0, 1.0, 0, load_calibration(folder).reference)

    ids, mask = _batch(world)
    by_hand = []
    for m in members:  # each member alone, normalised by its own calibration
        cal = load_calibration(m)
        by_hand.append((load_reward_model(m).score(ids, mask) - cal.mean) / cal.std)
    by_hand = torch.stack(by_hand).detach()

    loaded = load_reward_model(folder)  # the ensemble folder: its default rule
    assert isinstance(loaded, RewardEnsembleModel) and len(loaded) == 3
    with torch.no_grad():
        torch.testing.assert_close(loaded.member_scores(ids, mask), by_hand, rtol=0, atol=0)
        torch.testing.assert_close(loaded.score(ids, mask), MeanMinusStd(0.5)(by_hand), rtol=0, atol=0)
        combined, spread = loaded.score_and_disagreement(ids, mask)
        torch.testing.assert_close(combined, MeanMinusStd(0.5)(by_hand), rtol=0, atol=0)
        torch.testing.assert_close(spread, by_hand.std(dim=0), rtol=0, atol=0)
        again = load_reward_model(folder).score(ids, mask)  # reloads score identically
        assert torch.equal(again, loaded.score(ids, mask))
        for rule in (EnsembleMean(), WorstCase()):  # a rule given at load replaces the folder's
            torch.testing.assert_close(load_reward_ensemble(folder, rule).score(ids, mask), rule(by_hand),
                                       rtol=0, atol=0)
    assert not by_hand[0].equal(by_hand[1])  # the members differ, or the test shows nothing


def test_the_stage_folder_moves_whole(members, tmp_path):
    import shutil

    stage = tmp_path / "stage"
    for i, m in enumerate(members):
        shutil.copytree(m, stage / "members" / f"member_{i}" / "model")
    write_ensemble(stage / "model", [stage / "members" / f"member_{i}" / "model" for i in range(3)])
    moved = shutil.move(str(stage), str(tmp_path / "moved"))
    assert len(load_reward_ensemble(f"{moved}/model")) == 3


def test_bad_members_are_refused_naming_the_folder(members, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a reward-model folder"):
        write_ensemble(tmp_path / "e1", [members[0], tmp_path])
    other = tmp_path / "other"
    import shutil

    shutil.copytree(members[1], other)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text().replace("apple", "appel"))
    with pytest.raises(ValueError, match="tokenizers differ"):
        write_ensemble(tmp_path / "e2", [members[0], other])
    folder = write_ensemble(tmp_path / "e3", members[:2])
    spec = json.loads((folder / ENSEMBLE_FILE).read_text())
    spec["members"][1] = "../nowhere"
    (folder / ENSEMBLE_FILE).write_text(json.dumps(spec))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_reward_ensemble(folder)
    spec["combine"] = {"_target_": "lrlhf.functional.NoSuchRule"}
    spec["members"] = json.loads((write_ensemble(tmp_path / "e4", members[:2]) / ENSEMBLE_FILE).read_text())["members"]
    (tmp_path / "e4" / ENSEMBLE_FILE).write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="NoSuchRule"):
        load_reward_ensemble(tmp_path / "e4")
