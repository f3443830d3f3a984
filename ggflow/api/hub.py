"""GGUF files from the Hugging Face Hub: ``LLM.from_pretrained`` (llama-cpp-python's) and ``-hf REPO[:QUANT]``
(llama.cpp's), downloaded through ``huggingface_hub`` so its cache, resumed downloads, token (``HF_TOKEN``),
``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and progress bars all apply.

A repository's file list comes from the Hub's model API; offline (or with the Hub unreachable) it comes from
the files already in the cache, so a model downloaded once keeps working without a network.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggflow.errors import GGFlowError

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")   # llama.cpp's choice when -hf names no quant
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})\.gguf$", re.IGNORECASE)
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")   # GGUFs that are not a model


class HubError(GGFlowError):
    """A repository, file or download the Hub (or its cache, offline) cannot provide."""


@dataclass(frozen=True)
class HubSpec:
    """``owner/name[:QUANT]`` as llama.cpp's -hf takes it."""
    repo_id: str
    quant: str = ""

    @classmethod
    def parse(cls, text: str) -> "HubSpec":
        repo, _, quant = text.partition(":")
        if repo.count("/") != 1 or not all(repo.split("/")) or ":" in quant:
            raise HubError(f"-hf {text!r}: expected <user>/<model>[:quant], e.g. "
                           "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M")
        return cls(repo, quant)


def split_info(path: str) -> tuple[str, int, int]:
    """(prefix, index, count) of a split GGUF's shard name (``x-00001-of-00003.gguf``); (path, 1, 1) otherwise."""
    m = _SPLIT.match(path)
    return (m[1], int(m[2]), int(m[3])) if m else (path, 1, 1)


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(word in name for word in _NOT_MODELS)


def pick_model_file(files: list[str], quant: str = "") -> str | None:
    """llama.cpp's choice of a model file: the first whose name has QUANT followed by '.' or '-' (any case);
    without QUANT, Q4_K_M, then Q8_0, then the first GGUF. A split model is named by its first shard."""
    candidates = [f for f in files if is_model_file(f) and split_info(f)[1] == 1]
    for tag in ([quant] if quant else DEFAULT_QUANTS):
        pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
        found = next((f for f in candidates if pattern.search(f)), None)
        if found is not None:
            return found
    return None if quant or not candidates else candidates[0]


def shards(files: list[str], first: str) -> list[str]:
    """Every shard of the split model whose first shard is ``first`` (just ``first`` when it is not split)."""
    prefix, _, count = split_info(first)
    if count == 1:
        return [first]
    return sorted(f for f in files if split_info(f)[0] == prefix and split_info(f)[2] == count)


def endpoint() -> str:
    """HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def _cache_dir(cache_dir: "str | os.PathLike[str] | None") -> Path:
    from huggingface_hub import constants

    return Path(cache_dir if cache_dir is not None else os.environ.get("HF_HUB_CACHE", constants.HF_HUB_CACHE))


def cached_files(repo_id: str, revision: str, cache_dir=None, local_dir=None) -> list[str] | None:
    """The repository's files already downloaded (the cache's snapshot of ``revision``, or ``local_dir``)."""
    if local_dir is not None:
        root = Path(local_dir)
    else:
        repo = _cache_dir(cache_dir) / ("models--" + repo_id.replace("/", "--"))
        ref = repo / "refs" / revision
        commit = ref.read_text().strip() if ref.is_file() else revision
        root = repo / "snapshots" / commit
    if not root.is_dir():
        return None
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and ".cache" not in p.relative_to(root).parts)


def repo_files(repo_id: str, revision: str = "main", token: Any = None, cache_dir=None, local_dir=None) -> list[str]:
    """The repository's file names, from the Hub, or from the cache when offline or the Hub is unreachable."""
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf_errors

    if offline():
        files = cached_files(repo_id, revision, cache_dir, local_dir)
        if files is None:
            raise HubError(f"{repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: "
                           "download it once online (or unset HF_HUB_OFFLINE)")
        return files
    try:
        info = HfApi(endpoint=endpoint(), token=token).model_info(repo_id, revision=revision)
    except hf_errors.GatedRepoError as exc:
        raise HubError(f"{repo_id} is gated: accept its terms on the Hub and set HF_TOKEN "
                       f"({_first_line(exc)})") from None
    except hf_errors.RepositoryNotFoundError:
        raise HubError(f"no repository {repo_id!r} on {endpoint()} (or it is private: set HF_TOKEN)") from None
    except hf_errors.RevisionNotFoundError:
        raise HubError(f"{repo_id} has no revision {revision!r}") from None
    except hf_errors.HfHubHTTPError as exc:
        raise HubError(f"the Hub refused the file list of {repo_id}: {_first_line(exc)}") from None
    except Exception as exc:   # no network: httpx's TransportError (not an OSError), or an OSError
        if isinstance(exc, OSError) or type(exc).__module__.startswith("httpx"):
            return _cached_or_unreachable(repo_id, revision, cache_dir, local_dir, exc)
        raise
    return sorted(s.rfilename for s in info.siblings or [])


def _cached_or_unreachable(repo_id, revision, cache_dir, local_dir, exc: Exception) -> list[str]:
    files = cached_files(repo_id, revision, cache_dir, local_dir)
    if files is None:
        raise HubError(f"cannot reach the Hub at {endpoint()} ({_first_line(exc)}) and {repo_id} is not in the "
                       "cache: check the network, or HF_ENDPOINT") from None
    return files


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def matching(files: list[str], pattern: str, repo_id: str) -> str:
    """The one file a name or glob pattern matches (llama-cpp-python's rule: none or several is an error)."""
    found = [f for f in files if fnmatch.fnmatch(f, pattern)]
    if len(found) != 1:
        shown = ", ".join(f for f in files if f.lower().endswith(".gguf")) or "(no GGUF files)"
        what = "no file" if not found else f"{len(found)} files ({', '.join(found)})"
        raise HubError(f"{what} in {repo_id} match {pattern!r}; its GGUF files: {shown}")
    return found[0]


def download(repo_id: str, filenames: list[str], *, revision: str = "main", token: Any = None,
             cache_dir=None, local_dir=None) -> list[str]:
    """Each file's local path, downloaded (resuming a partial download) unless the cache has it already."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub import errors as hf_errors

    paths = []
    cache_dir = _cache_dir(cache_dir)   # HF_HUB_CACHE as it is now (huggingface_hub reads it at import)
    for name in filenames:
        try:
            paths.append(hf_hub_download(repo_id, name, revision=revision, token=token, cache_dir=cache_dir,
                                         local_dir=local_dir, endpoint=endpoint(), local_files_only=offline()))
        except hf_errors.RemoteEntryNotFoundError:
            raise HubError(f"{repo_id} has no file {name!r}") from None
        except hf_errors.LocalEntryNotFoundError as exc:
            raise HubError(f"cannot download {name} from {repo_id} ({endpoint()}) and it is not in the cache: "
                           f"{_first_line(exc)}") from None
        except hf_errors.HfHubHTTPError as exc:
            raise HubError(f"the Hub refused {name} of {repo_id}: {_first_line(exc)}") from None
    return paths


def resolve_hf(spec: str, *, token: Any = None, cache_dir=None) -> str:
    """``-hf REPO[:QUANT]``: the local path of the chosen model file (every shard of a split one downloaded)."""
    hub = HubSpec.parse(spec)
    files = repo_files(hub.repo_id, token=token, cache_dir=cache_dir)
    chosen = pick_model_file(files, hub.quant)
    if chosen is None:
        ggufs = ", ".join(f for f in files if is_model_file(f)) or "(none)"
        wanted = f"GGUF model file named with {hub.quant!r}" if hub.quant else "GGUF model file"
        raise HubError(f"{hub.repo_id} has no {wanted}; its GGUF model files: {ggufs}")
    return download(hub.repo_id, shards(files, chosen), token=token, cache_dir=cache_dir)[0]


def from_pretrained(cls: type, repo_id: str, filename: str | None, additional_files: list[str] | None = None,
                    local_dir=None, local_dir_use_symlinks: Any = "auto", cache_dir=None, *,
                    revision: str = "main", token: Any = None, **kwargs: Any):
    """llama-cpp-python's ``Llama.from_pretrained``: ``filename`` is a name or glob matching exactly one file
    (None: llama.cpp's default choice); ``additional_files`` (names or globs) are the other shards of a split
    model; the rest of ``kwargs`` go to the constructor. ``local_dir_use_symlinks`` is accepted and ignored, as
    huggingface_hub itself now does."""
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise HubError(f"repo_id {repo_id!r}: expected '<user>/<model>'")
    files = repo_files(repo_id, revision, token, cache_dir, local_dir)
    if filename is None:
        chosen = pick_model_file(files)
        if chosen is None:
            raise HubError(f"{repo_id} has no GGUF model file; its files: {', '.join(files) or '(none)'}")
        wanted = shards(files, chosen)
    else:
        chosen = matching(files, filename, repo_id)
        wanted = [chosen]
    for pattern in additional_files or []:
        extra = matching(files, pattern, repo_id)
        if extra not in wanted:
            wanted.append(extra)
    paths = download(repo_id, wanted, revision=revision, token=token, cache_dir=cache_dir, local_dir=local_dir)
    return cls(paths[0], **kwargs)
