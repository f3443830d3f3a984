"""Mixture-of-experts files with bad expert metadata or expert tensors are refused at load, with a
ModelLoadError that names the key (or tensor) and the values, as llama.cpp's load_hparams asserts them."""
from __future__ import annotations

import gguf
import pytest

from ggflow.core.model import Model
from ggflow.errors import ModelLoadError

pytest.importorskip("torch", reason="the tiny MoE models are made in transformers (torch 2.13.0)")
pytest.importorskip("transformers", minversion="5.0",
                    reason="the tiny models are written from transformers 5's layouts (fused expert tensors, rope_parameters)")

from tests.fixtures.tiny_moe import N_EXPERT, write_tiny_moe  # noqa: E402

U32, BOOL = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.BOOL


def load(tmp_path, arch="qwen3moe", **changes):
    path = tmp_path / f"{arch}.gguf"
    write_tiny_moe(path, arch, **changes)
    return Model.load(path)


@pytest.mark.parametrize("arch", ["qwen3moe", "llama"])
def test_more_experts_used_than_there_are_is_refused(tmp_path, arch):
    with pytest.raises(ModelLoadError, match=rf"{arch}\.expert_used_count.*= 9 must be in 1\.\.8"):
        load(tmp_path, arch, keys={"expert_used_count": (9, U32)})


def test_no_experts_used_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"expert_used_count.*= 0 must be in 1\.\.8"):
        load(tmp_path, keys={"expert_used_count": (0, U32)})


def test_qwen3moe_without_experts_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"qwen3moe\.expert_count.*n_expert must be > 0"):
        load(tmp_path, keys={"expert_count": None})


def test_expert_count_beyond_llama_cpp_limit_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"expert_count"):
        load(tmp_path, keys={"expert_count": (4096, U32)})


def test_experts_used_without_experts_is_refused_for_llama(tmp_path):
    with pytest.raises(ModelLoadError, match=r"llama\.expert_used_count.*= 2 but llama\.expert_count = 0"):
        load(tmp_path, "llama", keys={"expert_count": None})


def test_unknown_gating_function_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"expert_gating_func.*= 7 is not a gating function"):
        load(tmp_path, keys={"expert_gating_func": (7, U32)})


def test_gating_function_disagreeing_with_the_architecture_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"expert_gating_func.*= 2 \(sigmoid\) but qwen3moe routes with 1"):
        load(tmp_path, keys={"expert_gating_func": (2, U32)})


def test_agreeing_gating_and_norm_keys_load(tmp_path):
    model = load(tmp_path, keys={"expert_gating_func": (1, U32), "expert_weights_norm": (True, BOOL)})
    assert model.hparams.extra["experts"].norm_weights


def test_unnormalised_weights_for_qwen3moe_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"expert_weights_norm.*= False but qwen3moe normalises"):
        load(tmp_path, keys={"expert_weights_norm": (False, BOOL)})


@pytest.mark.parametrize("arch", ["qwen3moe", "llama"])
def test_expert_tensor_with_fewer_experts_than_the_count_is_refused(tmp_path, arch):
    name = "blk.1.ffn_up_exps.weight"
    with pytest.raises(ModelLoadError, match=rf"{name}.*\[64, 64, 7\], expected \[64, 64, {N_EXPERT}\]"):
        load(tmp_path, arch, tensors={name: lambda a: a[:-1].copy()})


def test_router_of_the_wrong_width_is_refused(tmp_path):
    name = "blk.0.ffn_gate_inp.weight"
    with pytest.raises(ModelLoadError, match=rf"{name}.*expected \[64, {N_EXPERT}\]"):
        load(tmp_path, tensors={name: lambda a: a[:4].copy()})


def test_expert_width_disagreeing_with_the_key_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"ffn_gate_exps.*expected \[64, 40, 8\]"):
        load(tmp_path, keys={"expert_feed_forward_length": (40, U32)})


def test_granite_without_logit_scale_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"granite\.logit_scale"):
        load(tmp_path, "granite", keys={"logit_scale": None})


def test_granite_with_zero_logit_scale_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"granite\.logit_scale.*= 0"):
        load(tmp_path, "granite", keys={"logit_scale": (0.0, gguf.GGUFValueType.FLOAT32)})


def test_gpt_oss_without_a_sliding_window_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"gpt-oss\.attention\.sliding_window"):
        load(tmp_path, "gpt-oss", keys={"attention.sliding_window": None})


def test_gpt_oss_with_softmax_gating_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"expert_gating_func.*= 1 \(softmax\) but gpt-oss routes with 3"):
        load(tmp_path, "gpt-oss", keys={"expert_gating_func": (1, U32)})


def test_gpt_oss_with_another_rope_scaling_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"rope\.scaling\.type.*'linear'"):
        load(tmp_path, "gpt-oss", keys={"rope.scaling.type": ("linear", gguf.GGUFValueType.STRING)})
