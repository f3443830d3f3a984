"""A conversation (OpenAI-shaped messages, tools) as prompt tokens, tool calling and grammar: what the chat
routes in other shapes (Anthropic's /v1/messages, OpenAI's /v1/responses) share with /v1/chat/completions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ggflow.errors import GGFlowError
from ggflow.serving.reasoning import prompt_opens_thinking
from ggflow.structured.chat_tools import ToolCalling


@dataclass
class PreparedChat:
    tokens: list[int]
    tools: ToolCalling | None
    grammar: Any
    in_think: bool                  # the rendered prompt opened a think block for the reply


def prepare_chat(state: Any, engine: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 tool_choice: Any, template_kwargs: dict[str, Any] | None = None, grammar: Any = None,
                 parallel_tool_calls: bool = True) -> PreparedChat:
    template = state.chat_template()
    calling = ToolCalling.for_request(tools, tool_choice, parallel_tool_calls, template.source)
    if calling is not None:
        tool_grammar = calling.grammar()
        if grammar is not None and tool_grammar is not None:
            raise GGFlowError("a request with tools cannot also constrain its output with a grammar or schema")
        grammar = grammar or tool_grammar
        messages = calling.messages(messages)
    kwargs = dict(template_kwargs or {})
    reserved = {"messages", "tools", "add_generation_prompt"} & set(kwargs)
    if reserved:
        raise GGFlowError(f"chat_template_kwargs cannot set {', '.join(sorted(reserved))}")
    prompt = template.render(messages, add_generation_prompt=True, tools=tools, **kwargs)
    bos = engine.vocab.bos_id
    has_bos = bos is not None and prompt.startswith(engine.vocab.token_text(bos))
    tokens = engine.vocab.tokenize(prompt, add_special=not has_bos, parse_special=True)
    return PreparedChat(tokens, calling, grammar, prompt_opens_thinking(prompt))
