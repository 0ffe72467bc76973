"""Chat templates: a model's Jinja template that turns a list of messages into its prompt text.

Where a template comes from: a Hugging Face directory's ``chat_template.jinja`` (transformers
writes it there since 4.43), else ``tokenizer_config.json``'s ``chat_template`` (a string, or a
list of named templates: "default", and "tool_use" when tools are passed and it exists); a GGUF
file's ``tokenizer.chat_template``. The special tokens the template may print (``bos_token``,
``eos_token``, ...) come from tokenizer_config.json, or from the GGUF vocabulary.

Rendering is transformers' (``PreTrainedTokenizerBase.apply_chat_template``), which the tests hold
it to on real templates: Jinja2's ImmutableSandboxedEnvironment (a template is untrusted code: no
attribute access to Python internals, no mutation of the inputs) with trim_blocks, lstrip_blocks
and loop controls; ``tojson`` without HTML escaping; ``raise_exception(msg)`` (raises
``jinja2.TemplateError``, reported here as ValueError); ``strftime_now(fmt)``; the
``{% generation %}`` block (rendered as its body); message keys whose value is None dropped; the
special tokens, ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and any extra
keyword (``enable_thinking``, ``date_string``, ...) passed as variables.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Iterable, Mapping

__all__ = ["ChatTemplate"]

_REASONING = ("reasoning_content", "thinking", "reasoning")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """{% generation %}...{% endgeneration %}: transformers marks assistant text with it; the
        text is rendered as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _plain(value: Any) -> Any:
    """JSON-like data only (what a template may see): dicts, lists, str, int, float, bool, None.
    Objects with model_dump (the openai package's pydantic messages) are converted."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    raise TypeError(f"chat messages and tools must be JSON-like data (dict, list, str, number), "
                    f"got {type(value).__name__}")


def _messages(messages: Any) -> list[dict]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise TypeError(f"messages must be a list of dicts with 'role' and 'content', got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if callable(getattr(m, "model_dump", None)):
            m = m.model_dump()
        if not isinstance(m, Mapping):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING if k in m), None)
        if reasoning is not None:  # transformers passes it under each name templates read
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        if not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] has no 'role' string: {m!r}")
        out.append(_plain(m))
    if not out:
        raise ValueError("messages is empty: a chat needs at least one message")
    return out


def _token_string(value: Any) -> str | None:
    if isinstance(value, Mapping):  # an AddedToken as tokenizer_config.json stores it
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A compiled chat template and the special tokens it may print.

        t = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
        t.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    """

    def __init__(self, source: str | Mapping[str, str], **special_tokens: str | None):
        if isinstance(source, Mapping):
            if not source or not all(isinstance(v, str) for v in source.values()):
                raise ValueError("a chat template set must map names to template strings")
            self.templates = dict(source)
        elif isinstance(source, str):
            self.templates = {"default": source}
        else:
            raise TypeError(f"a chat template is a Jinja string, got {type(source).__name__}")
        unknown = set(special_tokens) - set(SPECIAL_TOKENS)
        if unknown:
            raise TypeError(f"unknown special tokens {sorted(unknown)}; known: {', '.join(SPECIAL_TOKENS)}")
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        env = _environment()
        self._compiled = {}
        for name, text in self.templates.items():
            try:
                self._compiled[name] = env.from_string(text)
            except Exception as e:  # jinja2.TemplateSyntaxError
                raise ValueError(f"chat template {name!r} does not parse: {e}") from None

    @property
    def source(self) -> str:
        """The default template's text."""
        return self.templates.get("default", next(iter(self.templates.values())))

    def _select(self, tools) -> Any:
        if tools and "tool_use" in self._compiled:
            return self._compiled["tool_use"]
        if "default" in self._compiled:
            return self._compiled["default"]
        if len(self._compiled) == 1:
            return next(iter(self._compiled.values()))
        raise ValueError(f"no 'default' among the chat templates {sorted(self._compiled)}")

    def render(self, messages: Any, add_generation_prompt: bool = False, tools: list | None = None,
               documents: list | None = None, continue_final_message: bool = False, **kwargs: Any) -> str:
        """The prompt text for messages (dicts with role and content, as OpenAI's). kwargs become
        template variables (and override the special tokens)."""
        import jinja2

        msgs = _messages(messages)
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt exclude each other")
        if tools is not None:
            if callable(tools) or isinstance(tools, (str, Mapping)) or any(not isinstance(t, Mapping) for t in tools):
                raise TypeError("tools must be a list of JSON-schema dicts ({'type': 'function', 'function': ...})")
        tag = "CONTINUE_FINAL_MESSAGE_TAG "
        final = None
        if continue_final_message:
            final = msgs[-1].get("content")
            if not isinstance(final, str):
                raise ValueError("continue_final_message needs a final message with string content")
            msgs[-1]["content"] = final + tag
        variables = {**self.special_tokens, **_plain(kwargs)}
        try:
            text = self._select(tools).render(messages=msgs, tools=_plain(tools), documents=_plain(documents),
                                              add_generation_prompt=bool(add_generation_prompt), **variables)
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"the chat template refused these messages: {e}") from None
        if final is not None:
            at = text.rfind(tag.strip())
            if at < 0 or final.strip() not in text:
                raise ValueError("continue_final_message: the template does not print the final message as given")
            text = text[:at] if text[at:at + len(tag)] == tag else text[:at].rstrip()
        return text

    # -- where templates come from --------------------------------------------------------------

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "ChatTemplate | None":
        """A Hugging Face directory's template (chat_template.jinja or tokenizer_config.json), or
        None when it has none."""
        path = os.fspath(path)
        cfg: dict = {}
        cfg_file = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_file):
            with open(cfg_file, encoding="utf-8") as f:
                cfg = json.load(f)
        jinja_file = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                source: Any = f.read()
        else:
            source = cfg.get("chat_template")
            if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
                source = {t["name"]: t["template"] for t in source}
        if not source:
            return None
        return cls(source, **{k: _token_string(cfg.get(k)) for k in SPECIAL_TOKENS})

    @classmethod
    def from_gguf(cls, gf, tokenizer) -> "ChatTemplate | None":
        """A GGUF file's tokenizer.chat_template, with BOS / EOS strings from its vocabulary."""
        source = gf.chat_template
        if not source:
            return None
        hf = tokenizer.hf_tokenizer

        def token(tid):
            return hf.id_to_token(int(tid)) if tid is not None else None

        unk = gf.metadata.get("tokenizer.ggml.unknown_token_id")
        pad = gf.metadata.get("tokenizer.ggml.padding_token_id")
        return cls(source, bos_token=token(tokenizer.bos_token_id), eos_token=token(tokenizer.eos_token_id),
                   unk_token=token(unk), pad_token=token(pad))

    def __repr__(self) -> str:
        return f"ChatTemplate({', '.join(self.templates)}; {len(self.source)} chars)"
