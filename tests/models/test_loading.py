"""load_causal_lm / load_tokenizer: a model.name_or_path that names nothing loadable gets an error naming the key,
the path and what a model folder needs; hub ids are still read as hub ids (offline here: not cached)."""

import json
import re

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from lrlhf.models.loading import ModelConfig, load_causal_lm, load_tokenizer

LOADERS = [load_causal_lm, load_tokenizer]
NEEDS = "a model folder holds config.json, the weights (*.safetensors or pytorch_model.bin) and the tokenizer files"


def save_model(model, folder, *, weights=True, tokenizer=True):
    model.save_pretrained(folder)
    if not weights:
        for path in folder.glob("*.safetensors"):
            path.unlink()
    if tokenizer:
        backend = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "</s>": 1, "hi": 2}, unk_token="<unk>"))
        PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>").save_pretrained(folder)
    return folder


def message_of(loader, cfg) -> str:
    with pytest.raises(ValueError) as error:
        loader(cfg)
    return str(error.value)


@pytest.mark.parametrize("loader", LOADERS)
def test_a_missing_absolute_folder_is_named(tmp_path, loader):
    missing = tmp_path / "no" / "model"
    message = message_of(loader, ModelConfig(str(missing)))
    assert message == f"model.name_or_path={str(missing)!r}: no such folder"


@pytest.mark.parametrize("name", ["./missing", "../missing", "outputs/run/merged", "runs/sft", "a/b/c", "~/gone"])
@pytest.mark.parametrize("loader", LOADERS)
def test_a_missing_relative_folder_is_named_with_where_it_was_looked_for(tmp_path, monkeypatch, loader, name):
    (tmp_path / "work" / "runs").mkdir(parents=True)  # "runs/sft": its parent exists, so it is a path
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    message = message_of(loader, ModelConfig(name))
    resolved = (tmp_path / "work" / name.replace("~", "../home")).resolve()
    assert message == f"model.name_or_path={name!r}: no such folder ({resolved})"


@pytest.mark.parametrize("loader", LOADERS)
def test_an_empty_folder_says_what_a_model_folder_needs(tmp_path, loader):
    message = message_of(loader, ModelConfig(str(tmp_path)))
    assert message.startswith(f"model.name_or_path={str(tmp_path)!r}: not a model folder, it has no config.json "
                              "(it is empty); ")
    assert NEEDS in message and "or a .gguf file named by model.gguf_file" in message


@pytest.mark.parametrize("loader", LOADERS)
def test_a_folder_of_other_files_lists_them_and_points_at_a_gguf_file(tmp_path, loader):
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "model.Q4.gguf").write_bytes(b"GGUF")
    message = message_of(loader, ModelConfig(str(tmp_path)))
    assert "not a model folder, it has no config.json (it holds model.Q4.gguf, notes.txt); " in message
    assert message.endswith("; it holds a GGUF file: set model.gguf_file=model.Q4.gguf")


@pytest.mark.parametrize("loader", LOADERS)
def test_a_gguf_file_that_is_not_in_the_folder_is_named(tmp_path, loader):
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    message = message_of(loader, ModelConfig(str(tmp_path), gguf_file="model.gguf"))
    assert message == f"model.gguf_file='model.gguf': no such file in {tmp_path} (it holds other.gguf)"


@pytest.mark.parametrize("loader", LOADERS)
def test_a_file_given_as_the_folder_is_named(tmp_path, loader):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    message = message_of(loader, ModelConfig(str(path)))
    assert message == (f"model.name_or_path={str(path)!r}: a file, not a folder; for a GGUF file pass its folder "
                       f"as model.name_or_path and model.gguf_file=model.gguf")


def test_a_model_folder_without_weights_names_the_folder_and_what_it_needs(tmp_path, tiny_llama):
    save_model(tiny_llama, tmp_path, weights=False)
    message = message_of(load_causal_lm, ModelConfig(str(tmp_path)))
    assert message.startswith(f"model.name_or_path={str(tmp_path)!r}: cannot load the model from this folder (")
    assert NEEDS in message


def test_a_model_folder_without_tokenizer_files_names_the_folder_and_what_it_needs(tmp_path, tiny_llama):
    save_model(tiny_llama, tmp_path, tokenizer=False)
    message = message_of(load_tokenizer, ModelConfig(str(tmp_path)))
    assert message.startswith(
        f"model.name_or_path={str(tmp_path)!r}: cannot load the tokenizer from this folder (it has none of "
        "tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json); ")
    assert NEEDS in message and "sentencepiece" not in message


def test_a_complete_folder_still_loads(tmp_path, tiny_llama):
    save_model(tiny_llama, tmp_path)
    cfg = ModelConfig(str(tmp_path))
    assert load_causal_lm(cfg).training
    assert load_tokenizer(cfg).pad_token == "</s>"


def test_one_tokenizer_loader_takes_a_config_a_path_or_a_tokenizer(tmp_path, tiny_llama):
    from lrlhf.data.datamodules import load_tokenizer as data_loader

    save_model(tiny_llama, tmp_path)
    assert data_loader is load_tokenizer  # one implementation (lrlhf.utils.model_source), re-exported
    for source in (ModelConfig(str(tmp_path)), str(tmp_path), tmp_path):
        assert load_tokenizer(source).pad_token == "</s>"  # the folder checks and the pad guarantee for each
    tokenizer = load_tokenizer(str(tmp_path))
    assert load_tokenizer(tokenizer) is tokenizer  # a tokenizer (it has a name_or_path too) is used as is
    assert message_of(load_tokenizer, str(tmp_path / "gone")).endswith(": no such folder")


def test_a_tokenizer_only_folder_loads_a_tokenizer_and_is_not_a_model(tmp_path, tiny_llama):
    save_model(tiny_llama, tmp_path)
    for path in [tmp_path / "config.json", *tmp_path.glob("*.safetensors")]:
        path.unlink()
    assert load_tokenizer(ModelConfig(str(tmp_path))).eos_token == "</s>"
    assert "not a model folder, it has no config.json" in message_of(load_causal_lm, ModelConfig(str(tmp_path)))


def test_an_adapter_whose_base_is_missing_names_the_adapter_config(tmp_path):
    (tmp_path / "adapter").mkdir()
    config = tmp_path / "adapter" / "adapter_config.json"
    config.write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    message = message_of(load_causal_lm, ModelConfig(str(tmp_path / "adapter")))
    assert message == f"{config} base_model_name_or_path={str(tmp_path / 'gone')!r}: no such folder"


@pytest.mark.parametrize("loader", LOADERS)
def test_a_hub_id_not_cached_while_offline_names_the_key_and_says_so(loader):
    message = message_of(loader, ModelConfig("lrlhf-test/no-such-model"))
    assert re.match(
        r"model\.name_or_path='lrlhf-test/no-such-model': not a local folder, so a hub id, and not in the local "
        r"cache while the hub is offline \(HF_HUB_OFFLINE=1\)", message)


def test_check_model_source_fails_as_loading_would_without_loading(tmp_path, tiny_llama):
    from lrlhf.models.loading import ModelSourceError, check_model_source

    with pytest.raises(ModelSourceError, match="no such folder"):
        check_model_source(ModelConfig(str(tmp_path / "gone")))
    check_model_source(ModelConfig(str(save_model(tiny_llama, tmp_path))))
    check_model_source(ModelConfig("some-org/some-model"))  # a hub id: reachability shows at loading
