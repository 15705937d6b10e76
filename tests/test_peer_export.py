"""The peer-engine plumbing that runs without the `peer` extra.

- A `random:` model exported as a Hugging Face directory loads back with
  plain transformers (config, safetensors, tokenizer) and gives the same
  logits as the model we serve.
- Without llama-cpp-python, the GGUF step and the server helper fail with
  PeerUnavailable (a clear note), and `bench ttft`'s llamacpp mode is skipped
  with that note instead of failing the bench.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from headstart.models import ModelLoadError, load_model
from headstart.peer.hf_export import export_hf_dir

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


@pytest.fixture
def run_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSTART_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_export_loads_back_with_transformers_and_gives_the_same_logits(run_home):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = export_hf_dir("random:tiny", seed=3)
    assert out.is_relative_to(run_home)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()}
    assert json.loads((out / "headstart_export.json").read_text())["model_id"] == "random:tiny@seed3"

    ours = load_model("random:tiny", dtype="float32", seed=3)
    theirs = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    text = "<|im_start|>user\nHow many singers are there?<|im_end|>\n<|im_start|>assistant\n"
    ids = ours.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    with torch.no_grad():
        a = ours.model(torch.tensor([ids])).logits
        b = theirs(torch.tensor([ids])).logits
    assert torch.equal(a, b)
    # A different seed is a different model: the comparison above could fail.
    other = load_model("random:tiny", dtype="float32", seed=4)
    with torch.no_grad():
        assert not torch.equal(other.model(torch.tensor([ids])).logits, a)


def test_export_is_cached_and_rebuilt_on_force(run_home):
    first = export_hf_dir("random:tiny")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert export_hf_dir("random:tiny") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert export_hf_dir("random:tiny", force=True) == first
    assert not first.with_name(first.name + ".tmp").exists()


def test_export_of_a_bad_spec_is_a_typed_error(run_home, tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model preset"):
        export_hf_dir("random:no-such-preset")
    with pytest.raises(ModelLoadError, match="tokenizer"):
        export_hf_dir("random:tiny", tokenizer_dir=tmp_path / "empty")


@pytest.mark.skipif(HAS_LLAMA_CPP, reason="checks the behaviour without the peer extra")
def test_without_the_extra_gguf_and_server_say_how_to_install(run_home, monkeypatch):
    from headstart.peer.gguf_convert import PeerUnavailable, convert_to_gguf
    from headstart.peer.llamacpp_server import LlamaCppServer

    # nor a built C++ llama-server, whose source tree would hold the converter
    monkeypatch.setenv("HEADSTART_LLAMA_SERVER", str(run_home / "no-llama-server"))

    with pytest.raises(PeerUnavailable, match="peer extra"):
        convert_to_gguf("random:tiny", "f32")
    with pytest.raises(PeerUnavailable, match="peer extra"):
        LlamaCppServer("random:tiny")
    assert not (run_home / "peer" / "gguf").exists()


def test_unknown_gguf_type_is_a_value_error(run_home):
    from headstart.peer.gguf_convert import convert_to_gguf

    with pytest.raises(ValueError, match="unknown GGUF type"):
        convert_to_gguf("random:tiny", "q4_0")
