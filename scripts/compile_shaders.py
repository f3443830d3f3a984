#!/usr/bin/env python3
"""Rebuild the Vulkan backend's SPIR-V (ggflow/backends_builtin/vulkan/shaders/*.spv) with glslc.

Each variant is a .comp source compiled with some #defines (a weight type, an op, an element type).
The .spv files are committed and shipped as package data, so users need no shader compiler; run this
after editing a .comp or .glsl file and commit both.

    python scripts/compile_shaders.py            # all variants
    python scripts/compile_shaders.py binary     # variants whose name starts with "binary"
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SHADERS = Path(__file__).resolve().parents[1] / "ggflow" / "backends_builtin" / "vulkan" / "shaders"
GLSLC_FLAGS = ["--target-env=vulkan1.2", "-O"]

FLOATS = {"f32": "float", "f16": "float16_t"}
D_F16 = {"f32": {}, "f16": {"D_F16": "1"}}   # F16 results are rounded by round_f16 before the store (common.glsl)
QUANTIZABLE = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")   # types set_rows can write (a quantized KV cache)
WEIGHT_TYPES = ("f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")


def variants() -> dict[str, tuple[str, dict[str, str]]]:
    """output name -> (source file, defines)."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for op in ("add", "mul"):
        out[f"binary_{op}"] = ("binary.comp", {f"OP_{op.upper()}": "1"})
    for op in ("scale", "silu", "gelu"):
        for a in FLOATS:
            for d in FLOATS:
                out[f"unary_{op}_{a}_{d}"] = ("unary.comp", {f"OP_{op.upper()}": "1", "A_TYPE": FLOATS[a],
                                                              "D_TYPE": FLOATS[d], **D_F16[d]})
    out["norm_rms"] = ("norm.comp", {"RMS": "1"})
    out["norm_layer"] = ("norm.comp", {})
    out["norm_rms_mul"] = ("norm_fused.comp", {})                     # chains fusion.py runs as one dispatch
    out["add_norm_rms_mul"] = ("norm_fused.comp", {"ADD_FIRST": "1"})
    out["silu_mul"] = ("silu_mul.comp", {})
    out["soft_max_f32"] = ("soft_max.comp", {"M_TYPE": "float"})
    out["soft_max_f16"] = ("soft_max.comp", {"M_TYPE": "float16_t"})
    for mode in ("normal", "neox"):
        for a in FLOATS:
            for d in FLOATS:
                defines = {"A_TYPE": FLOATS[a], "D_TYPE": FLOATS[d], **D_F16[d]}
                if mode == "neox":
                    defines["NEOX"] = "1"
                out[f"rope_{mode}_{a}_{d}"] = ("rope.comp", defines)
    for a in FLOATS:
        for d in FLOATS:
            types = {"A_TYPE": FLOATS[a], "D_TYPE": FLOATS[d], **D_F16[d]}
            out[f"copy_{a}_{d}"] = ("copy.comp", types)
            out[f"copy_reshape_{a}_{d}"] = ("copy.comp", {**types, "RESHAPE": "1"})
            out[f"set_rows_{a}_{d}"] = ("set_rows.comp", types)
    out["copy_raw16"] = ("copy.comp", {"A_TYPE": "uint16_t", "D_TYPE": "uint16_t", "RAW": "1"})
    for q in QUANTIZABLE:
        out[f"set_rows_f32_{q}"] = ("set_rows_quant.comp", {f"D_{q.upper()}": "1"})
    for w in WEIGHT_TYPES:
        out[f"get_rows_{w}"] = ("get_rows.comp", _weight_defines(w))
        out[f"mul_mat_vec_{w}"] = ("mul_mat_vec.comp", _weight_defines(w))
        out[f"mul_mat_tiled_{w}"] = ("mul_mat_tiled.comp", _weight_defines(w))
    for kernel in ("mul_mat_vec", "mul_mat_tiled"):   # F16 weights whose b round_act_f16 rounded ahead
        out[f"{kernel}_f16_prerounded"] = (f"{kernel}.comp", {**_weight_defines("f16"), "B_ROUNDED": "1"})
    for kind in ("q8_0", "q8_1", "q8_k", "f16"):
        out[f"round_act_{kind}"] = ("round_act.comp", {f"ROUND_{kind.upper()}": "1"})
    return out


def _weight_defines(w: str) -> dict[str, str]:
    if w in FLOATS:
        return {"A_FLOAT": "1", "A_TYPE": FLOATS[w], **({"A_F16": "1"} if w == "f16" else {})}
    return {f"A_{w.upper()}": "1"}


def compile_one(glslc: str, name: str, source: str, defines: dict[str, str]) -> str | None:
    cmd = [glslc, *GLSLC_FLAGS, *(f"-D{k}={v}" for k, v in defines.items()), "-fshader-stage=compute",
           str(SHADERS / source), "-o", str(SHADERS / f"{name}.spv")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    return None if done.returncode == 0 else f"{name}: {done.stderr.strip()}"


def main(argv: list[str]) -> int:
    glslc = shutil.which("glslc")
    if glslc is None:
        print("glslc not found: apt-get install glslc (or the Vulkan SDK)", file=sys.stderr)
        return 1
    wanted = {n: v for n, v in variants().items() if not argv or any(n.startswith(a) for a in argv)}
    missing_sources = sorted({src for src, _ in wanted.values() if not (SHADERS / src).is_file()})
    wanted = {n: v for n, v in wanted.items() if v[0] not in missing_sources}
    with ThreadPoolExecutor() as pool:
        errors = [e for e in pool.map(lambda item: compile_one(glslc, item[0], *item[1]), wanted.items()) if e]
    for e in errors:
        print(e, file=sys.stderr)
    if missing_sources:
        print(f"skipped variants of missing sources: {', '.join(missing_sources)}", file=sys.stderr)
    print(f"compiled {len(wanted) - len(errors)} of {len(wanted)} shaders into {SHADERS}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
