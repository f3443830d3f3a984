"""Write a random-weight F16 GGUF model of a real model's shape, for speed and memory comparisons.

Issue 14's table has rows for models no PyPI package ships (TinyLlama-1.1B, Qwen2-0.5B); what a benchmark
needs of them is their shape, not their weights. This writes one with gguf's GGUFWriter: every matrix
random normal (std 0.02, so that activations stay finite through the layers), norms 1, and the tokenizer
copied from a vocabulary file of llama.cpp's (../shared/vocab), so llama.cpp and ggflow both load it.
Quantize the result with llama-quantize (or `ggflow quantize`) to the types to compare:

    python benchmarks/make_shape_model.py tinyllama-1.1b /tmp/tinyllama-f16.gguf
    llama-quantize /tmp/tinyllama-f16.gguf /tmp/tinyllama-q4_0.gguf Q4_0
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "vocab"


@dataclass(frozen=True)
class Shape:
    arch: str
    vocab_file: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    rope_base: float
    qkv_bias: bool = False
    tied_output: bool = False
    n_expert: int = 0          # experts per layer in place of the FFN (qwen3moe), 0: dense
    n_expert_used: int = 0
    qk_norm: bool = False      # qwen3's RMSNorm over each head of Q and K
    head_dim: int = 0          # 0: n_embd / n_head


SHAPES = {
    # TinyLlama/TinyLlama-1.1B-Chat-v1.0's config.json
    "tinyllama-1.1b": Shape("llama", "ggml-vocab-llama-spm.gguf", 2048, 22, 32, 4, 5632, 2048, 10000.0),
    # HuggingFaceTB/SmolLM2-135M-Instruct's config.json (the default model's shape, for machines it cannot travel to;
    # StarCoder's vocabulary has the same 49,152 tokens)
    "smollm2-135m": Shape("llama", "ggml-vocab-starcoder.gguf", 576, 30, 9, 3, 1536, 8192, 100000.0, tied_output=True),
    # Qwen/Qwen2-0.5B-Instruct's config.json (its vocabulary file holds 151,936 tokens' worth of the 151,646 used)
    "qwen2-0.5b": Shape("qwen2", "ggml-vocab-qwen2.gguf", 896, 24, 14, 2, 4864, 32768, 1000000.0,
                        qkv_bias=True, tied_output=True),
    # issue 38's Qwen3-MoE-shaped model: 3.6 B total, ~0.5 B active (64 experts of n_ff 768, 8 used)
    "qwen3moe-3.6b-a0.5b": Shape("qwen3moe", "ggml-vocab-qwen2.gguf", 1024, 24, 16, 4, 768, 32768, 1000000.0,
                                 n_expert=64, n_expert_used=8, qk_norm=True, head_dim=128),
    # the same block at a size a shared machine can write and run (4 layers, 32 experts)
    "qwen3moe-small": Shape("qwen3moe", "ggml-vocab-qwen2.gguf", 1024, 4, 16, 4, 768, 32768, 1000000.0,
                            n_expert=32, n_expert_used=8, qk_norm=True, head_dim=128),
    # meta-llama/Meta-Llama-3-8B's config.json with a 32k vocabulary (issue 43: the size people run)
    "llama3-8b": Shape("llama", "ggml-vocab-llama-spm.gguf", 4096, 32, 32, 8, 14336, 8192, 500000.0),
}


def copy_tokenizer(writer, vocab_path: Path) -> int:
    """Every tokenizer.* key of a vocabulary file, as it is there; returns the vocabulary's size."""
    from gguf import GGUFReader, GGUFValueType
    reader = GGUFReader(str(vocab_path))
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        if field.types[0] == GGUFValueType.ARRAY:
            writer.add_array(name, value)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            writer.add_key_value(name, value, field.types[0])
    return n_vocab


def write_model(shape: Shape, out: Path, seed: int = 0) -> None:
    from gguf import GGUFWriter
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(out), shape.arch)
    n_vocab = copy_tokenizer(writer, VOCAB_DIR / shape.vocab_file)
    a = shape.arch
    writer.add_name(f"random {out.stem}")
    writer.add_uint32(f"{a}.context_length", shape.n_ctx_train)
    writer.add_uint32(f"{a}.embedding_length", shape.n_embd)
    writer.add_uint32(f"{a}.block_count", shape.n_layer)
    writer.add_uint32(f"{a}.feed_forward_length", shape.n_ff)
    writer.add_uint32(f"{a}.attention.head_count", shape.n_head)
    writer.add_uint32(f"{a}.attention.head_count_kv", shape.n_head_kv)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{a}.rope.freq_base", shape.rope_base)
    hd = shape.head_dim or shape.n_embd // shape.n_head
    writer.add_uint32(f"{a}.rope.dimension_count", hd)
    if shape.head_dim:
        writer.add_uint32(f"{a}.attention.key_length", hd)
        writer.add_uint32(f"{a}.attention.value_length", hd)
    if shape.n_expert:
        writer.add_uint32(f"{a}.expert_count", shape.n_expert)
        writer.add_uint32(f"{a}.expert_used_count", shape.n_expert_used)
        writer.add_uint32(f"{a}.expert_feed_forward_length", shape.n_ff)
    writer.add_uint32("general.file_type", 1)   # mostly F16

    # Tensors are declared first and generated one at a time as they are written, so an 8 B model (16 GB of
    # F16) never sits in memory whole.
    specs: list[tuple[str, tuple[int, ...], object]] = []

    def matrix(name: str, rows: int, cols: int) -> None:   # ggml's ne = (cols, rows): numpy (rows, cols)
        specs.append((name, (rows, cols), lambda: (rng.standard_normal((rows, cols), np.float32) * 0.02)
                      .astype(np.float16)))

    def vector(name: str, n: int, value: float) -> None:
        specs.append((name, (n,), lambda: np.full(n, value, np.float32)))

    def experts(name: str, rows: int, cols: int) -> None:   # ne = (cols, rows, n_expert)
        specs.append((name, (shape.n_expert, rows, cols), lambda: (rng.standard_normal(
            (shape.n_expert, rows, cols), np.float32) * 0.02).astype(np.float16)))

    e = shape.n_embd
    matrix("token_embd.weight", n_vocab, e)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", e, 1.0)
        matrix(p + "attn_q.weight", shape.n_head * hd, e)
        matrix(p + "attn_k.weight", shape.n_head_kv * hd, e)
        matrix(p + "attn_v.weight", shape.n_head_kv * hd, e)
        if shape.qkv_bias:
            vector(p + "attn_q.bias", e, 0.0)
            vector(p + "attn_k.bias", shape.n_head_kv * hd, 0.0)
            vector(p + "attn_v.bias", shape.n_head_kv * hd, 0.0)
        matrix(p + "attn_output.weight", e, shape.n_head * hd)
        if shape.qk_norm:
            vector(p + "attn_q_norm.weight", hd, 1.0)
            vector(p + "attn_k_norm.weight", hd, 1.0)
        vector(p + "ffn_norm.weight", e, 1.0)
        if shape.n_expert:
            specs.append((p + "ffn_gate_inp.weight", (shape.n_expert, e),
                          lambda: rng.standard_normal((shape.n_expert, e), np.float32)))
            experts(p + "ffn_gate_exps.weight", shape.n_ff, e)
            experts(p + "ffn_up_exps.weight", shape.n_ff, e)
            experts(p + "ffn_down_exps.weight", e, shape.n_ff)
            continue
        matrix(p + "ffn_gate.weight", shape.n_ff, e)
        matrix(p + "ffn_up.weight", shape.n_ff, e)
        matrix(p + "ffn_down.weight", e, shape.n_ff)
    vector("output_norm.weight", e, 1.0)
    if not shape.tied_output:
        matrix("output.weight", n_vocab, e)
    for name, dims, make in specs:
        dtype = np.float32 if len(dims) == 1 or name.endswith("ffn_gate_inp.weight") else np.float16
        writer.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, _, make in specs:
        writer.write_tensor_data(make())
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not (VOCAB_DIR / SHAPES[args.shape].vocab_file).exists():
        raise SystemExit(f"{VOCAB_DIR / SHAPES[args.shape].vocab_file} is missing: the tokenizer comes from there")
    write_model(SHAPES[args.shape], args.out, args.seed)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
