"""Render OpenAI chat messages with the checkpoint's chat template, and place the image tokens.

`template_messages` turns OpenAI content parts into the form Hugging Face chat templates read: text
parts stay `{"type": "text", "text"}`, each `image_url` part becomes `{"type": "image"}` (the template
writes the model's `<image>` placeholder there) and its URL goes to a list, in prompt order.
Vision-language templates (llava-hf's) iterate over content parts, so they get parts; text-only
templates usually expect strings, so text-only models get the text parts joined.

`expand_placeholders` (pure) replaces the i-th single image token with `counts[i]` copies and returns
where each run starts: that is the `offset` of the i-th `ImageItem`.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from appliance.errors import ConfigError, InputError
from appliance.protocol.openai_requests import image_url


TOOL_KEYS = ("tool_calls", "tool_call_id")


@dataclass(frozen=True)
class ChatRendering:
    """How a chat becomes a prompt. A chat completion takes the defaults; `/tokenize` may set vLLM's
    options, and only counts (a prompt past the context is not refused there: the client compares)."""
    add_generation_prompt: bool = True     # end with the assistant's turn opening
    continue_final_message: bool = False   # leave the last message open instead
    add_special_tokens: Optional[bool] = None  # None: BOS unless the template wrote it (encode_rendered)
    fit_context: bool = True               # refuse a prompt that does not fit the context


def template_messages(messages: List[Dict[str, Any]],
                      parts: bool) -> Tuple[List[Dict[str, Any]], List[Tuple[str, str]]]:
    """(messages for apply_chat_template, [(image URL, field name)] in prompt order)."""
    rendered, images = [], []
    for i, message in enumerate(messages):
        content = message.get("content") or ""  # an assistant message of tool calls may have none
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        out_parts = []
        for j, part in enumerate(content):
            if part["type"] == "image_url":
                images.append((image_url(part), f"messages[{i}].content[{j}].image_url"))
                out_parts.append({"type": "image"})
            else:
                out_parts.append({"type": "text", "text": part["text"]})
        rendered_content: Union[str, List[Dict[str, str]]] = out_parts
        if not parts:
            rendered_content = " ".join(p["text"] for p in out_parts if p["type"] == "text")
        # OpenAI's `developer` role is what chat templates know as `system`.
        role = "system" if message["role"] == "developer" else message["role"]
        tool_keys = {key: message[key] for key in TOOL_KEYS if key in message}  # read by templates with tools
        rendered.append({**tool_keys, "role": role, "content": rendered_content})
    return rendered, images


def render_text(tokenizer, messages: List[Dict[str, Any]], rendering: ChatRendering = ChatRendering(),
                tools: Optional[List[Dict[str, Any]]] = None) -> str:
    """The chat template applied to `messages` (and `tools`, for a template that knows them:
    tool_prompt.py), by default ending with the generation prompt (`encode_rendered` turns it into
    token ids; in between, a text too long for the context is refused untokenized)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("model.path: the tokenizer has no chat_template; use a chat/instruct checkpoint "
                          "(tokenizer_config.json 'chat_template' or chat_template.jinja)")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=rendering.add_generation_prompt,
                                         continue_final_message=rendering.continue_final_message, tokenize=False,
                                         tools=tools)


def encode_rendered(tokenizer, text: str, add_special_tokens: Optional[bool] = None) -> List[int]:
    """Token ids of a rendered chat; by default BOS is added by the tokenizer unless the template already
    wrote it."""
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not (bos and text.startswith(bos)) if add_special_tokens is None else add_special_tokens
    return list(tokenizer(text, add_special_tokens=add_special)["input_ids"])


def expand_placeholders(ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> Tuple[List[int], List[int]]:
    """Each single `image_token_id` in `ids` -> `counts[i]` copies; returns (new ids, start of each run).
    The ids must hold exactly len(counts) image tokens (the caller checks user text for stray ones)."""
    found = sum(1 for t in ids if t == image_token_id)
    if found != len(counts):
        raise ValueError(f"prompt holds {found} image tokens for {len(counts)} images")
    out: List[int] = []
    offsets: List[int] = []
    for token in ids:
        if token == image_token_id:
            offsets.append(len(out))
            out.extend([image_token_id] * counts[len(offsets) - 1])
        else:
            out.append(token)
    return out, offsets


def check_image_tokens(ids: Sequence[int], image_token_id: int, num_images: int, where: str) -> None:
    """The rendered prompt must hold one image token per image: more means the user's text contains the
    placeholder itself; fewer means the chat template dropped the images."""
    found = sum(1 for t in ids if t == image_token_id)
    if found > num_images:
        raise InputError(f"{where}: the message text contains the image placeholder token "
                         f"({found - num_images} extra); send images as image_url parts, not as text", param=where)
    if found < num_images:
        raise ConfigError(f"model.path: the chat template wrote {found} image placeholders for {num_images} "
                          "images; it must render each {'type': 'image'} part as the <image> token")
