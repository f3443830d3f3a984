"""Writing the converted model: each tensor's type as llama.cpp's converter picks it, the file through
``gguf`` (gguf-py: the GGUF writer llama.cpp's own converter uses, so both write the same layout and the
same F16/BF16/Q8_0 bytes), one tensor read, converted and written at a time, into a temporary file that is
renamed over OUT only once complete (an interrupted or failed run leaves no half-written model).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ggflow.errors import GGFlowError

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
# llama.cpp's converter keeps these in F32 whatever the outtype (they are small or read by get_rows/add)
ALWAYS_F32 = ("position_embd.weight", "token_types.weight")


@dataclass
class TensorPlan:
    """One output tensor: its GGUF name, shape in numpy order (ggml's ne reversed) and how to read it."""
    name: str
    shape: tuple[int, ...]
    read: Callable[[], np.ndarray]


class ConvertError(GGFlowError, ValueError):
    """A model directory or option the converter cannot turn into a GGUF file."""


def tensor_type(name: str, shape: Sequence[int], outtype: str):
    """The GGML type of one tensor, as llama.cpp's converter chooses it: 1-D tensors, norms, biases and
    the embeddings of positions and token types in F32; everything else in the outtype; Q8_0 where a
    row is not a whole number of 32-element blocks falls back to F16."""
    from gguf import GGMLQuantizationType as T

    if (len(shape) <= 1 or name.endswith("_norm.weight") or name in ALWAYS_F32
            or not name.endswith(".weight")):
        return T.F32
    kind = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0}[outtype]
    if kind == T.Q8_0 and shape[-1] % 32:
        return T.F16
    return kind


def file_type(outtype: str) -> int:
    """general.file_type (llama_ftype) for the outtype."""
    from gguf import LlamaFileType as F

    return {"f32": F.ALL_F32, "f16": F.MOSTLY_F16, "bf16": F.MOSTLY_BF16, "q8_0": F.MOSTLY_Q8_0}[outtype]


def write_gguf(out: str | os.PathLike, arch: str, set_metadata: Callable, plans: list[TensorPlan], outtype: str,
               progress: bool = True) -> None:
    """Write the GGUF file: metadata (``set_metadata(writer)``), tensor infos, then each tensor's data."""
    import gguf
    from tqdm import tqdm   # the progress bar (a dependency already: ggflow quantize shows one too)

    out = Path(out)
    if out.is_dir():
        raise ConvertError(f"{out}: is a directory; give the output file's name (OUT.gguf)")
    if not out.parent.is_dir():
        raise ConvertError(f"{out.parent}: no such directory for the output file")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(None, arch)
        set_metadata(writer)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_file_type(file_type(outtype))
        types = [tensor_type(p.name, p.shape, outtype) for p in plans]
        for plan, kind in zip(plans, types):
            block, size = gguf.GGML_QUANT_SIZES[kind]
            nbytes = int(np.prod(plan.shape)) // block * size
            writer.add_tensor_info(plan.name, plan.shape, np.float32, nbytes, raw_dtype=kind)
        writer.write_header_to_file(Path(tmp))
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        total = sum(int(np.prod(p.shape)) for p in plans)
        with tqdm(total=total, unit="w", unit_scale=True, desc=f"writing {out.name}", disable=not progress) as bar:
            for plan, kind in zip(plans, types):
                data = np.ascontiguousarray(plan.read(), dtype=np.float32)
                if data.shape != tuple(plan.shape):
                    raise ConvertError(f"tensor {plan.name}: read shape {list(data.shape)}, expected {list(plan.shape)}")
                if kind != gguf.GGMLQuantizationType.F32:
                    data = gguf.quants.quantize(data, kind)
                writer.write_tensor_data(data)
                bar.update(int(np.prod(plan.shape)))
                del data
        writer.close()
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
