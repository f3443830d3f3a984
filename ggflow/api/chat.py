"""llama-cpp-python's (OpenAI's) chat completion on LLM: messages through the model's own chat template,
``tools``/``tool_choice`` handed to the template and the answer's tool calls parsed into OpenAI
``tool_calls`` (ggflow.structured.chat_tools), OpenAI's ``logprobs``/``top_logprobs``, streamed chunks."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from ggflow.api import arguments as A
from ggflow.api import harmony, shapes
from ggflow.api.chat_tokens import chat_prompt_tokens
from ggflow.api.completions import array_callables, llama_sampling
from ggflow.generation.logprobs import chat_logprobs, generated_entries
from ggflow.errors import ArgumentError

if TYPE_CHECKING:
    from ggflow.structured.chat_tools import ToolCalling

FINISH_TOOL_CALLS = "tool_calls"   # as ggflow.structured.chat_tools (not imported: llguidance is optional)


class ChatMixin:
    def chat_template(self):
        if self._template is None:
            from ggflow.core.chat_template import ChatTemplate
            self._require_context()
            self._template = ChatTemplate.for_vocab(self.model.metadata.get("tokenizer.chat_template"), self.vocab)
        return self._template

    def chat_prompt_tokens(self, messages: Any, tools: Any = None, tool_choice: Any = None,
                           calling: "ToolCalling | None" = None) -> list[int]:
        """The checked messages rendered by the chat template (with the assistant's turn opened), as tokens;
        ``calling`` shows the conversation as the tools' format needs it (see ``tool_calling``)."""
        messages = A.check_messages(messages)
        if calling is not None:
            messages = calling.messages(messages)
        # an assistant turn that only calls tools has content None (OpenAI); templates concatenate content
        messages = [{**m, "content": ""} if m.get("content") is None else m for m in messages]
        tools = A.check_tools(tools)
        tool_choice = A.check_tool_choice(tool_choice)
        variables = {} if tool_choice is None else {"tool_choice": tool_choice}
        return chat_prompt_tokens(self.chat_template(), self.vocab, messages, tools, **variables)

    def create_chat_completion(self, messages: list[dict[str, Any]], functions: list | None = None,
                               function_call: Any = None, tools: list | None = None, tool_choice: Any = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               typical_p: float = 1.0, stream: bool = False, stop: "str | list[str] | None" = None,
                               seed: int | None = None, response_format: Any = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor: Any = None, grammar: Any = None,
                               logit_bias: dict[int, float] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None, parallel_tool_calls: bool = True,
                               **sampling_options: Any) -> "dict[str, Any] | Iterator[dict[str, Any]]":
        """An OpenAI-shaped chat completion (or, with stream=True, its chunks)."""
        if isinstance(functions, int) and not isinstance(functions, bool) and max_tokens is None:
            functions, max_tokens = None, functions  # ggflow's older create_chat_completion(messages, max_tokens)
        if functions is not None:  # OpenAI's older spelling of tools
            tools = (tools or []) + [{"type": "function", "function": f} for f in A.check_functions(functions)]
        if function_call is not None and tool_choice is None:
            tool_choice = function_call if isinstance(function_call, str) else {"type": "function",
                                                                               "function": function_call}
        stream = A.check_bool("stream", stream)
        n_top = _chat_top_logprobs(logprobs, top_logprobs, self.vocab.n_vocab)
        options = llama_sampling(temperature, top_p, min_p, typical_p, frequency_penalty, presence_penalty,
                                 repeat_penalty, top_k, seed, tfs_z, mirostat_mode, mirostat_tau, mirostat_eta,
                                 logit_bias, grammar, sampling_options)
        calling = self.tool_calling(tools, tool_choice, parallel_tool_calls)
        tool_grammar = calling.grammar() if calling is not None else None
        if tool_grammar is not None:
            if options.get("grammar") is not None or response_format is not None:
                raise ArgumentError("tools", "with grammar or response_format",
                                    "tools alone: tool_choice required/a function constrains the reply itself")
            options["grammar"] = tool_grammar
        tokens = self.chat_prompt_tokens(messages, tools, tool_choice, calling)
        gen = self.generate(tokens, max_tokens, stop=stop, stream=True, logprobs=n_top,
                            logits_processor=array_callables(logits_processor), response_format=response_format,
                            **options)
        ident, created, name = shapes.completion_id("chatcmpl"), shapes.now(), model or self.model_path
        if stream:
            return self._chat_chunks(gen, ident, created, name, n_top is not None, calling)
        for _ in gen:
            pass
        result = gen.result
        lp = chat_logprobs(self.vocab, generated_entries(self.vocab, result)) if n_top is not None else None
        out = shapes.chat_completion(ident, created, name, result.text, lp, result.finish_reason,
                                     len(result.prompt_tokens), len(result.tokens))
        if calling is not None:
            message, finish = calling.reply(result.text, result.finish_reason)
            out["choices"][0].update(message=message, finish_reason=finish)
        elif harmony.is_harmony(self.chat_template().source):   # gpt-oss: analysis -> reasoning_content
            reasoning, content = harmony.split_reply(self.vocab.detokenize(result.tokens, unparse_special=True))
            message = out["choices"][0]["message"]
            message["content"] = content
            if reasoning is not None:
                message["reasoning_content"] = reasoning
        out["timings"] = result.timings.as_dict()
        return out

    def tool_calling(self, tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = True
                     ) -> "ToolCalling | None":
        """The request's tools resolved against this model's chat template (None without tools)."""
        if tools is None:
            return None
        from ggflow.structured.chat_tools import ToolCalling
        return ToolCalling.for_request(A.check_tools(tools), A.check_tool_choice(tool_choice), parallel_tool_calls,
                                       self.chat_template().source)

    def _chat_chunks(self, gen: Any, ident: str, created: int, model: str, want_logprobs: bool,
                     calling: "ToolCalling | None" = None) -> Iterator[dict[str, Any]]:
        yield shapes.chat_chunk(ident, created, model, {"role": "assistant"}, None, None)
        held = calling.stream() if calling is not None else None   # text that may still become a tool call
        seen = 0
        for piece in gen:
            lp = None
            if want_logprobs:
                lp = chat_logprobs(self.vocab, [e for e in gen.logprobs[seen:] if not self.vocab.is_eog(e.token)])
                seen = len(gen.logprobs)
            text = held.feed(piece) if held is not None else piece
            if text or lp:
                yield shapes.chat_chunk(ident, created, model, {"content": text}, lp, None)
        finish = gen.result.finish_reason
        if held is not None:
            rest, calls = held.finish()
            if rest:
                yield shapes.chat_chunk(ident, created, model, {"content": rest}, None, None)
            if calls:
                delta = {"tool_calls": [c.as_openai(index=i) for i, c in enumerate(calls)]}
                yield shapes.chat_chunk(ident, created, model, delta, None, None)
                finish = FINISH_TOOL_CALLS if finish == "stop" else finish
        yield shapes.chat_chunk(ident, created, model, {}, None, finish)


def _chat_top_logprobs(logprobs: Any, top_logprobs: Any, n_vocab: int) -> int | None:
    """OpenAI's pair: logprobs=True asks for them, top_logprobs (0..) for that many alternatives too."""
    if logprobs is None or logprobs is False:
        if top_logprobs is not None:
            raise ArgumentError("top_logprobs", top_logprobs, "None unless logprobs=True")
        return None
    A.check_bool("logprobs", logprobs)
    return 0 if top_logprobs is None else A.check_logprobs(top_logprobs, n_vocab, "top_logprobs")
