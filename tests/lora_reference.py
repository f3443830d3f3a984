"""A tiny random llama in Hugging Face format, a random peft LoRA adapter on it, and both converted to GGUF by
llama.cpp's own converters (convert_hf_to_gguf.py, convert_lora_to_gguf.py): the reference pair for the LoRA
tests. transformers + peft run the same weights as the reference.

The converters come from the llama-cpp-python sdist (.ci/run unpacks them to LLAMACPP_SRC; test tooling only,
never committed); llama.cpp's llama converter imports sentencepiece even for a tokenizer.json. Without them,
or without peft, the tests that need the pair skip and say why. The tokenizer (needed by the base converter
only; the tests feed token ids) is the tiny llama's of tests/data, exported by transformers.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.data_dir import DATA

LLAMACPP_SRC = Path(os.environ.get("GGFLOW_LLAMACPP_SRC", Path.home() / ".cache" / "ggflow-test" / "llama.cpp-src"))
TOKENIZER_GGUF = DATA / "models" / "tiny-llama-hs-f32.gguf"   # vocabulary of 512: the random model's
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
RANK, ALPHA = 4, 8


@dataclass
class LoraPair:
    hf_base: Path        # the HF model directory
    hf_adapter: Path     # peft's adapter directory
    base: Path           # base GGUF (convert_hf_to_gguf.py, f32)
    adapters: list[Path]  # adapter GGUFs (convert_lora_to_gguf.py, f32): seeds 1, 2, ...


def _convert(args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # its own gguf-py, not ours
    run = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        pytest.skip(f"llama.cpp's converter failed here ({Path(args[0]).name}): {run.stderr[-600:]}")


def convert_adapter(pair: LoraPair, outtype: str, out: Path) -> Path:
    """The first adapter converted again, to ``outtype`` (f16, bf16, q8_0: its lora tensors' type)."""
    _convert([str(LLAMACPP_SRC / "convert_lora_to_gguf.py"), str(pair.hf_adapter), "--base", str(pair.hf_base),
              "--outfile", str(out), "--outtype", outtype])
    return out


def build_lora_pair(root: Path, n_adapters: int = 1, embed_tokens: bool = False) -> LoraPair:
    """The random base (seed 0) and n_adapters random adapters (seeds 1..n), converted."""
    for script in ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py"):
        if not (LLAMACPP_SRC / script).is_file():
            pytest.skip(f"{LLAMACPP_SRC / script} is missing: set GGFLOW_LLAMACPP_SRC to llama.cpp's source "
                        "(the llama-cpp-python sdist; .ci/run unpacks it)")
    pytest.importorskip("sentencepiece", reason="llama.cpp's llama converter imports sentencepiece")
    torch = pytest.importorskip("torch", reason="torch (the reference) is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers (the reference) is not installed")
    peft = pytest.importorskip("peft", reason="peft (the LoRA reference) is not installed: pip install peft")
    transformers.logging.set_verbosity_error()
    hf_base = root / "base"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(hf_base, safe_serialization=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(TOKENIZER_GGUF.parent), gguf_file=TOKENIZER_GGUF.name)
    tokenizer.save_pretrained(hf_base)
    base = root / "base-f32.gguf"
    _convert([str(LLAMACPP_SRC / "convert_hf_to_gguf.py"), str(hf_base), "--outfile", str(base), "--outtype", "f32"])
    adapters = []
    for seed in range(1, n_adapters + 1):
        torch.manual_seed(seed)
        targets = TARGETS + (["embed_tokens"] if embed_tokens else [])
        # init_lora_weights=False: B random too (peft's default B = 0 would make the adapter do nothing)
        config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, init_lora_weights=False)
        hf_adapter = root / f"adapter{seed}"
        peft.get_peft_model(transformers.LlamaForCausalLM.from_pretrained(hf_base), config).save_pretrained(hf_adapter)
        out = root / f"adapter{seed}-f32.gguf"
        _convert([str(LLAMACPP_SRC / "convert_lora_to_gguf.py"), str(hf_adapter), "--base", str(hf_base),
                  "--outfile", str(out), "--outtype", "f32"])
        adapters.append(out)
    return LoraPair(hf_base, root / "adapter1", base, adapters)


def peft_logits(pair: LoraPair, token_ids: list[int], scale: float | None = 1.0, adapter: Path | None = None):
    """Logits [n_tokens, n_vocab] of transformers + peft (CPU, fp32) with the adapter at ``scale`` times its
    alpha / rank (peft's set_scale); scale None: the base model alone."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(pair.hf_base, dtype=torch.float32).eval()
    if scale is not None:
        model = peft.PeftModel.from_pretrained(model, adapter or pair.hf_adapter).eval()
        for module in model.modules():
            if isinstance(module, peft.tuners.lora.LoraLayer):
                module.set_scale("default", scale)
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().numpy()
