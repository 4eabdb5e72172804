"""The embedded tiny LLaVA's files (appliance/assets/models/llava_tiny): sizes, tokenizer, processor,
model and how they are saved, in the layout of a real llava-hf checkpoint. scripts/train_tiny_llava.py
builds them with these functions and trains the model.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_shapes import (COLOR_ANSWERS, COLOR_QUESTIONS, COLORS, SHAPE_ANSWERS,
                              SHAPE_QUESTIONS, SHAPES)

IMAGE_SIZE, PATCH_SIZE = 112, 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # CLS dropped by the "default" feature selection: 64
OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
SPECIALS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>"}  # ids 0, 1, 2 as in Llama
IMAGE_TOKEN, PAD_TOKEN = "<image>", "<pad>"                # appended after the vocabulary, as llava-hf does

VISION = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
              image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, hidden_act="quick_gelu", projection_dim=64)
TEXT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False)

# LLaVA-1.5's conversation format as llava-hf templates it: "USER: <image>\n{prompt} ASSISTANT:";
# image parts render first as "<image>\n", then the text parts each followed by a space.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ content['text'] + ' ' }}{% endgeneration %}"
    "{% else %}{{ content['text'] + ' ' }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


# ---- tokenizer and processor ----

def tokenizer_corpus() -> list[str]:
    """Every phrase the model sees or says, plus the chat scaffolding, for the BPE merges."""
    words = [*COLORS, *SHAPES, "colour", "USER: ASSISTANT: SYSTEM:", "yes no"]
    lines = list(COLOR_QUESTIONS) + list(SHAPE_QUESTIONS)
    lines += [a.format(color=c) for a in COLOR_ANSWERS for c in COLORS]
    lines += [a.format(shape=s) for a in SHAPE_ANSWERS for s in SHAPES]
    return lines + words


def build_tokenizer(corpus: list[str] | None = None, chat_template: str = CHAT_TEMPLATE,
                    max_length: int = TEXT["max_position_embeddings"]):
    """A Llama-style BPE: metaspace words, the 256 `<0xNN>` byte tokens as ordinary vocabulary (byte
    fallback: any text encodes and decodes), `<s>` added in front; `<image>` and `<pad>` go last. The
    merges are learned on `corpus` (default: tokenizer_corpus()) until each of its words is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    def metaspace():
        return pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)

    # 1. learn the merges on the Q/A text
    scratch = Tokenizer(models.BPE(unk_token=SPECIALS["unk"]))
    scratch.pre_tokenizer = metaspace()
    scratch.train_from_iterator(corpus or tokenizer_corpus(), trainers.BpeTrainer(
        vocab_size=4000,  # more than the corpus has: merging stops when every word is one token
        special_tokens=list(SPECIALS.values()), show_progress=False))
    learned = json.loads(scratch.to_str())["model"]
    # 2. vocabulary: specials (0-2), bytes (3-258), then the learned characters and merges
    vocab = {t: i for i, t in enumerate([*SPECIALS.values(), *(f"<0x{b:02X}>" for b in range(256))])}
    for token, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=SPECIALS["unk"], byte_fallback=True,
                               fuse_unk=True))
    tok.pre_tokenizer = metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([*SPECIALS.values(), IMAGE_TOKEN, PAD_TOKEN])
    bos = SPECIALS["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS["bos"], eos_token=SPECIALS["eos"], unk_token=SPECIALS["unk"],
        pad_token=PAD_TOKEN, extra_special_tokens={"image_token": IMAGE_TOKEN}, padding_side="left",
        model_max_length=max_length, chat_template=chat_template)


def build_processor(tokenizer, chat_template: str = CHAT_TEMPLATE):
    """LlavaProcessor: LLaVA-1.5's "pad" aspect mode (pad to square with the mean colour, then the CLIP
    steps), so a shape near the edge of a long image is never cropped away."""
    from transformers import LlavaImageProcessorPil, LlavaProcessor

    image_processor = LlavaImageProcessorPil(
        do_pad=True, do_resize=True, size={"shortest_edge": IMAGE_SIZE}, resample=3,
        do_center_crop=True, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD, do_convert_rgb=True)
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=chat_template)


def build_model(tokenizer, max_positions: int = TEXT["max_position_embeddings"]):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    text = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       **{**TEXT, "max_position_embeddings": max_positions})
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**VISION), text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), image_seq_length=IMAGE_TOKENS,
        projector_hidden_act="gelu", vision_feature_select_strategy="default", vision_feature_layer=-2,
        tie_word_embeddings=False)
    config.architectures = ["LlavaForConditionalGeneration"]
    config.pad_token_id = tokenizer.pad_token_id
    model = LlavaForConditionalGeneration(config)
    init_position_embeddings(model.model.vision_tower)
    return model


@torch.no_grad()
def init_position_embeddings(tower) -> None:
    """Start CLIP's learned position embeddings from a 2D sin-cos table (CLS row 0): initialisation
    only, they are trained as usual. From the default N(0, 0.02) start the tower learned shapes about
    a third more slowly in our probes: it has no sense of which patches are neighbours."""
    table = tower.embeddings.position_embedding.weight
    side, dim = int(math.isqrt(table.shape[0] - 1)), table.shape[1]
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    yy, xx = torch.meshgrid(torch.arange(side, dtype=torch.float32), torch.arange(side, dtype=torch.float32),
                            indexing="ij")
    parts = []
    for pos in (yy.flatten(), xx.flatten()):
        angles = pos[:, None] * omega[None]
        parts += [angles.sin(), angles.cos()]
    table[0] = 0.0
    table[1:] = torch.cat(parts, dim=1)


def save(model, processor, out: Path, chat_template: str = CHAT_TEMPLATE) -> None:
    """save_pretrained, plus the files older loaders and our engine read: preprocessor_config.json
    (transformers 5 nests it in processor_config.json) and the chat template inside
    tokenizer_config.json (transformers 5 writes chat_template.jinja)."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32).save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    processor.image_processor.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    for key in ("is_local", "local_files_only"):  # load-time options that transformers echoes back
        tokenizer_config.pop(key, None)
    tokenizer_config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=chat_template)
    config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
