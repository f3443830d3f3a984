"""The whole run: read the input's header, plan each tensor's type, write the header, then convert or copy
the tensors one at a time into a temporary file that replaces OUT once complete."""
from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import gguf

from ggflow.errors import GGFlowError
from ggflow.quantize_model.convert import InputData, convert_rows, uses_importance
from ggflow.quantize_model.importance import ImportanceWeights, load_imatrix
from ggflow.quantize_model.mixes import Mix, find_mix
from ggflow.quantize_model.overrides import TensorTypes, make_overrides
from ggflow.quantize_model.plan import Planned, model_facts, open_input, plan
from ggflow.quantize_model.report import QuantizeReport, TensorResult
from ggflow.quantize_model.writer import GGUFOutput, metadata_entries


def quantize_model(in_path: str | os.PathLike, out_path: str | os.PathLike, ftype: str, pure: bool = False,
                   progress: bool = True, *, tensor_types: TensorTypes | None = None,
                   output_tensor_type: str | None = None, token_embedding_type: str | None = None,
                   imatrix: str | os.PathLike | None = None) -> QuantizeReport:
    """Write in_path's model to out_path in the llama.cpp mix `ftype` ("Q4_K_M", "Q8_0", "F16", ...),
    or with every quantizable tensor in the tensor type `ftype` names (any registered type with a
    quantizer, a plugin's too: "Q6_K", "IQ4_NL", ...).

    pure: every quantizable tensor in the mix's base type (no promotions; a row that doesn't fit the
    block still falls back). As llama-quantize's options: tensor_types {PATTERN: TYPE} (or
    'PATTERN=TYPE' strings): the first regex found in a tensor's name gives it TYPE
    (--tensor-type); output_tensor_type and token_embedding_type type output.weight and
    token_embd.weight. Raises UnknownNameError for an unknown mix or type, ArgumentError for a
    malformed PATTERN=TYPE or a bad regex, ModelLoadError for an input that is missing or not a
    readable GGUF file, QuantizationError for a tensor that can't be converted.
    """
    start = time.perf_counter()
    mix = find_mix(ftype)
    overrides = make_overrides(tensor_types, output_tensor_type, token_embedding_type)
    importance = ImportanceWeights(*load_imatrix(imatrix)) if imatrix is not None else None
    in_path, out_path = str(in_path), Path(out_path)
    src = open_input(in_path)
    planned = plan(src, mix, model_facts(src), pure, overrides, has_imatrix=importance is not None)
    if importance is not None:
        importance.check(planned)
    _check_output_path(in_path, out_path)
    report = QuantizeReport(in_path, str(out_path), mix.name, mix.ftype, pure, in_size=src.size,
                            imatrix=importance.path if importance is not None else None)
    tmp = out_path.with_name(f".{out_path.name}.{uuid.uuid4().hex[:12]}.tmp")
    out = GGUFOutput(str(tmp), src.alignment)  # opens no file until its header is written
    try:
        out.write_header(metadata_entries(src, mix.ftype, importance.metadata() if importance is not None else ()),
                         [(p.desc.name, p.desc.ne, _type_id(p), p.out_bytes) for p in planned])
        report.tensors = _write_tensors(out, in_path, planned, mix, progress, importance)
        out.close()
        _fsync(tmp)
        os.replace(tmp, out_path)
    except BaseException:  # Ctrl-C too: never leave a partial file behind
        out.close()
        tmp.unlink(missing_ok=True)
        raise
    report.out_size = os.path.getsize(out_path)
    report.seconds = time.perf_counter() - start
    return report


def _type_id(p: Planned) -> int:
    # A converted tensor's type is registered (a plugin's id may be one gguf-py doesn't know); a copied
    # one keeps the input's id, which gguf-py named.
    return p.out_traits.type_id if p.converts else int(gguf.GGMLQuantizationType[p.desc.type_name])


def _check_output_path(in_path: str, out_path: Path) -> None:
    parent = out_path.parent
    if not parent.is_dir():
        raise GGFlowError(f"{out_path}: cannot write there, the directory {parent} does not exist")
    if out_path.is_dir():
        raise GGFlowError(f"{out_path} is a directory; give the output file's name")
    # The input is read while the output is written, and a failed or wrong mix must leave the original:
    # never replace it, under its own name or another (a symlink, a hard link).
    if out_path.exists() and os.path.samefile(in_path, out_path):
        alias = "" if os.path.abspath(in_path) == os.path.abspath(out_path) else " (the same file under another name)"
        raise GGFlowError(f"OUT.gguf {str(out_path)!r} is the input IN.gguf {in_path!r}{alias}; quantize never "
                          "overwrites its input: give another output path")


def _write_tensors(out: GGUFOutput, in_path: str, planned: list[Planned], mix: Mix,
                   progress: bool, importance: ImportanceWeights | None = None) -> list[TensorResult]:
    from tqdm import tqdm

    results = []
    total = sum(p.in_bytes for p in planned)
    with InputData(in_path) as data, tqdm(total=total, unit="B", unit_scale=True, desc=f"quantizing to {mix.name}",
                                          file=sys.stderr, disable=not progress, leave=False) as bar:
        for p in planned:
            bar.set_postfix_str(p.desc.name, refresh=False)
            src = data.rows(p.offset, p.in_bytes, p.n_rows)
            weights = None
            if importance is not None and p.converts and uses_importance(p):
                weights = importance.weights.get(p.desc.name)
            out.write_tensor_data(convert_rows(p, src, bar, weights) if p.converts else src)
            if not p.converts:
                bar.update(p.in_bytes)
            del src
            data.release(p.offset, p.in_bytes)
            results.append(_result(p, importance))
    return results


def _result(p: Planned, importance: ImportanceWeights | None = None) -> TensorResult:
    if not p.converts:
        action = "copied"
    elif p.in_traits.is_quantized:
        action = "requantized"
    else:
        action = "converted"
    weighted = None   # with an imatrix: whether its weights reached the encoder
    if importance is not None and p.converts and p.out_traits.is_quantized:
        weighted = p.desc.name in importance.weights and uses_importance(p)
    return TensorResult(p.desc.name, p.desc.ne, p.desc.type_name, p.choice.type_name, action,
                        p.choice.fallback_from, p.in_bytes, p.out_bytes, weighted)


def _fsync(path: Path) -> None:
    # The rename must not outlive the data: a crash after os.replace would otherwise leave a hole.
    with open(path, "rb") as f:
        os.fsync(f.fileno())
