"""Chat templates render exactly as transformers' tokenizer.apply_chat_template (the oracle) on the
real Qwen2.5, Qwen3, Llama 3.1 and Llama 3.2 templates in ../shared/tokenizers/chat_templates:
system prompts, multi-turn, add_generation_prompt on and off, tools and tool results, Qwen3's
enable_thinking, earlier <think> blocks, non-ASCII and HTML-ish text, continue_final_message, and
the templates' own refusals (raise_exception) — where transformers raises, rlx raises ValueError.
Then end to end: rlx.load(dir).apply_chat_template on a saved Qwen3 directory equals its
transformers tokenizer, text and ids; a GGUF file's tokenizer.chat_template is found and used; the
sandbox refuses what a template must not do.
"""

from __future__ import annotations

import itertools

import pytest
from chat_paths import STORIES, TEMPLATES, needs_stories

from rlx.chat_template import ChatTemplate

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# name -> (template file, the special tokens of the model's tokenizer_config.json)
MODELS = {
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")),
    "llama3.1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")),
    "llama3.2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    "multi_turn": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is 2+2?"},
                   {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}],
    "ends_with_assistant": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}],
    "unicode_html": [{"role": "user", "content": "héllo 世界 <b>&amp;</b> \"quoted\" \\ back\nline"}],
    "thinking_history": [{"role": "user", "content": "Think first."},
                         {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nDone."},
                         {"role": "user", "content": "Again"}],
    "tool_call": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "content": "22 C, sunny"}],
    "none_content": [{"role": "user", "content": "Hi", "name": None}],
    # refused by some templates (Qwen3: no user query; Llama 3.1: one tool call at a time)
    "system_only": [{"role": "system", "content": "Only a system prompt."}],
    "two_tool_calls": [{"role": "user", "content": "Weather in Paris and Rome?"},
                       {"role": "assistant", "content": "", "tool_calls": [
                           {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                           {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]}],
}


def oracle(special: dict, template: str):
    """A transformers tokenizer carrying only the special tokens (rendering to text does not
    depend on the vocabulary)."""
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, chat_template=template, **special)


def cases():
    for (model, (_, _)), conv, gen_prompt in itertools.product(MODELS.items(), CONVERSATIONS, (False, True)):
        extras = [{}]
        if model == "qwen3":
            extras = [{}, {"enable_thinking": False}, {"enable_thinking": True}]
        elif model.startswith("llama"):
            extras = [{}, {"date_string": "26 Jul 2024"}]
        for extra in extras:
            for tools in ([None, [WEATHER]] if conv in ("user", "tool_call") else [None]):
                label = "-".join([model, conv, "gen" if gen_prompt else "nogen"] + [f"{k}={v}" for k, v in
                                 extra.items()] + (["tools"] if tools else []))
                yield pytest.param(model, conv, gen_prompt, extra, tools, id=label)


CASES = list(cases())


def test_parity_case_count():
    assert len(CASES) >= 100  # reported: the number of conversations compared with transformers


@pytest.mark.parametrize("model,conv,gen_prompt,extra,tools", CASES)
def test_template_renders_as_transformers(model, conv, gen_prompt, extra, tools):
    file, special = MODELS[model]
    source = (TEMPLATES / file).read_text()
    messages = CONVERSATIONS[conv]
    try:
        want = oracle(special, source).apply_chat_template(messages, tools=tools, add_generation_prompt=gen_prompt,
                                                           tokenize=False, **extra)
    except Exception as e:  # the template's own raise_exception: rlx raises ValueError with its message
        with pytest.raises(ValueError) as ours:
            ChatTemplate(source, **special).render(messages, add_generation_prompt=gen_prompt, tools=tools, **extra)
        assert str(e) in str(ours.value)
        return
    got = ChatTemplate(source, **special).render(messages, add_generation_prompt=gen_prompt, tools=tools, **extra)
    assert got == want


@pytest.mark.parametrize("model", list(MODELS))
def test_continue_final_message_as_transformers(model):
    file, special = MODELS[model]
    source = (TEMPLATES / file).read_text()
    messages = [{"role": "user", "content": "Finish this"}, {"role": "assistant", "content": "The answer is"}]
    want = oracle(special, source).apply_chat_template(messages, continue_final_message=True, tokenize=False)
    got = ChatTemplate(source, **special).render(messages, continue_final_message=True)
    assert got == want and got.endswith("The answer is")


def test_model_apply_chat_template_equals_transformers_text_and_ids(qwen3_dir, qwen3_hf_tokenizer):
    import rlx

    model = rlx.load(qwen3_dir)
    assert model.chat_template is not None and model.chat_template.special_tokens["eos_token"] == "<|im_end|>"
    for messages in CONVERSATIONS.values():
        for gen_prompt in (False, True):
            want = qwen3_hf_tokenizer.apply_chat_template(messages, add_generation_prompt=gen_prompt, tokenize=False)
            assert model.apply_chat_template(messages, add_generation_prompt=gen_prompt) == want
            want_ids = qwen3_hf_tokenizer.apply_chat_template(messages, add_generation_prompt=gen_prompt,
                                                              tokenize=True, return_dict=False)
            assert model.apply_chat_template(messages, add_generation_prompt=gen_prompt, tokenize=True) == want_ids
    # Qwen3's <|im_end|> (the template's eos_token) ends generation, with generation_config's ids
    assert {151645, 151643} <= model.eos_token_ids


def test_template_set_picks_tool_use_when_tools_are_given():
    t = ChatTemplate({"default": "D{{ messages[0].content }}", "tool_use": "T{{ tools[0].function.name }}"})
    msgs = [{"role": "user", "content": "x"}]
    assert t.render(msgs) == "Dx"
    assert t.render(msgs, tools=[WEATHER]) == "Tget_weather"


def test_sandbox_refuses_python_internals_and_errors_are_value_errors():
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(Exception) as e:
        ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}").render(msgs)
    assert "unsafe" in str(e.value).lower() or "security" in type(e.value).__name__.lower()
    with pytest.raises(ValueError, match="nope"):
        ChatTemplate("{{ raise_exception('nope') }}").render(msgs)
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% if %}")
    with pytest.raises(TypeError):
        ChatTemplate("x").render("a string is not a list of messages")
    with pytest.raises(ValueError, match="role"):
        ChatTemplate("x").render([{"content": "no role"}])


@needs_stories
def test_gguf_chat_template_is_read_from_the_file(tmp_path):
    """A GGUF's tokenizer.chat_template (and its BOS text) is what rlx.load(file.gguf) renders with."""
    import gguf
    import numpy as np
    import sentencepiece

    import rlx
    from rlx.gguf import permute_qk
    from rlx.weights import expected_weights

    cfg = rlx.load_config(STORIES)
    state = rlx.load_weights(STORIES)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(STORIES / "tok512.model"))
    path = tmp_path / "stories.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, kind, value in [
        ("block_count", "uint32", cfg.num_hidden_layers), ("context_length", "uint32", cfg.max_position_embeddings),
        ("embedding_length", "uint32", cfg.hidden_size), ("feed_forward_length", "uint32", cfg.intermediate_size),
        ("attention.head_count", "uint32", cfg.num_attention_heads),
        ("attention.head_count_kv", "uint32", cfg.num_key_value_heads),
        ("rope.dimension_count", "uint32", cfg.head_dim), ("rope.freq_base", "float32", cfg.rope_theta),
        ("attention.layer_norm_rms_epsilon", "float32", cfg.rms_norm_eps)]:
        getattr(w, f"add_{kind}")(f"llama.{key}", value)
    n = sp.get_piece_size()
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
                       for i in range(n)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant]{% endif %}")
    for name in expected_weights(cfg):
        x = np.asarray(state[name], np.float32)
        if ".q_proj." in name or ".k_proj." in name:
            x = permute_qk(x, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        w.add_tensor(name_in_gguf(name), np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    model = rlx.load(path)
    msgs = [{"role": "user", "content": "Hi"}]
    assert model.apply_chat_template(msgs, add_generation_prompt=True) == "<s>[user] Hi\n[assistant]"
    reply = model.create_chat_completion(msgs, max_tokens=5)
    assert reply["usage"]["prompt_tokens"] == len(model.apply_chat_template(msgs, add_generation_prompt=True,
                                                                             tokenize=True))


def name_in_gguf(hf: str) -> str:
    """llama.cpp's tensor names for stories260K's tensors."""
    table = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in table:
        return table[hf]
    parts = hf.split(".")  # model.layers.{i}.{...}
    i, rest = parts[2], ".".join(parts[3:])
    names = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight"}
    return f"blk.{i}.{names[rest]}"
