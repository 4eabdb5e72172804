#!/usr/bin/env python
"""Train the tool-calling tiny LLaVA (conf/model/llava_tiny_tools.yaml) from the embedded one.

The model is appliance/assets/models/llava_tiny with a chat template that puts the request's tools in
front of the chat (scripts/tiny_llava_tools.py: a Hermes-style `<tools>` block), a tokenizer whose
merges also cover the tool definitions, calls and requests (rows of tokens the old tokenizer had keep
their trained embeddings), and a context of MAX_POSITIONS. Fine-tuning (the projector and the language
model; the vision tower stays as trained) teaches it to choose:
- a draw request ("Draw a blue circle.") or a resize request ("Make the shape bigger.") gets exactly one
  hermes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` when the tool list holds the tool;
- the same request gets text when the list lacks that tool or there are no tools;
- a question about the image ("What color is the shape?") gets its text answer, tools or not.
Tool lists are random subsets of the three tools in random order, a description left out now and then.

Evaluation draws fresh cases from EVAL_SEED (images and choices training never sees) and scores greedy
answers: `call_when_appropriate` (exactly one call, of the right tool), `arguments_valid` (they validate
against the tool's schema), `arguments_right` (they are what was asked), `text_when_appropriate` (no
`<tool_call>` at all) and the colour/shape accuracy of the questions with tools in the prompt.

    .venv/bin/python scripts/train_tiny_llava_tools.py                  # the committed model
    .venv/bin/python scripts/train_tiny_llava_tools.py --eval-only      # re-score the committed model
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shlex
import sys
import time
from pathlib import Path

import jsonschema
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_shapes import COLOR_QUESTIONS, SHAPE_QUESTIONS, generate, qa_pairs
from tiny_llava_files import IMAGE_TOKEN, build_model, build_processor, build_tokenizer, save
from tiny_llava_tools import (CHAT_TEMPLATE_TOOLS, MAX_POSITIONS, NO_TOOL_ANSWERS, TOOLS, corpus, request,
                              tool_call, tool_list)
from train_tiny_llava import (DEFAULT_OUT as BASE, EVAL_SEED, TORCH_SEED, TRAIN_SEED, TrainingSet, _expand,
                              _warmup_cosine, answer_ids, collate, is_correct)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "appliance" / "assets" / "models" / "llava_tiny_tools"
CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


# ---- cases: (prompt parts, tools, answer, what is scored) ----

def draw_case(rng: random.Random, labels_pool: int) -> dict:
    """One training or evaluation case: a question about image `i`, or a tool request with the tool
    listed or not (then the answer is text), with or without an image."""
    kind = rng.choices(("question", "draw_shape", "resize_shape"), weights=(0.4, 0.3, 0.3))[0]
    image = rng.randrange(labels_pool)
    if kind == "question":
        tools = tool_list(rng) if rng.random() < 0.7 else []
        return {"kind": kind, "image": image, "with_image": True, "tools": tools}
    listed = rng.random() < 0.65
    tools = tool_list(rng, must=kind) if listed else tool_list(rng, without=kind)
    text, arguments = request(kind, rng)
    with_image = rng.random() < (0.5 if kind == "draw_shape" else 0.8)
    return {"kind": kind, "image": image, "with_image": with_image, "tools": tools, "text": text,
            "arguments": arguments if listed else None}


def answer(case: dict, labels, rng: random.Random | None) -> tuple[str, str]:
    """(question text, answer text) of a case; a question's phrasing from `rng` (None: the first)."""
    if case["kind"] == "question":
        return (qa_pairs(labels, rng) if rng else qa_pairs(labels))[case.get("which", rng.randrange(2) if rng else 0)]
    if case["arguments"] is None:
        return case["text"], NO_TOOL_ANSWERS[case["kind"]]
    return case["text"], tool_call(case["kind"], case["arguments"])


def prompt(processor, case: dict, question: str) -> str:
    content = ([{"type": "image"}] if case["with_image"] else []) + [{"type": "text", "text": question}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tools=case["tools"] or None)


def batch(data: TrainingSet, processor, size: int, rng: random.Random) -> dict:
    rows, images = [], []
    for _ in range(size):
        case = draw_case(rng, len(data.labels))
        question, reply = answer(case, data.labels[case["image"]], rng)
        text = prompt(processor, case, question)
        prompt_ids = processor.tokenizer(_expand(processor.tokenizer, text))["input_ids"]
        rows.append((answer_ids(processor.tokenizer, prompt_ids, text, reply), len(prompt_ids)))
        if case["with_image"]:
            images.append(case["image"])
    pixels = data.pixels[images].float()
    flip = torch.tensor([rng.random() < 0.5 for _ in images], dtype=torch.bool)
    pixels[flip] = pixels[flip].flip(-1)
    out = collate(rows, pixels, processor.tokenizer.pad_token_id)
    if not images:
        out["pixel_values"] = None
    return out


# ---- the model: llava_tiny's weights under the new tokenizer ----

def transplant(base, tokenizer, base_tokenizer):
    """A model for `tokenizer` (context MAX_POSITIONS) holding `base`'s weights; embedding and output
    rows of tokens both vocabularies have are copied, new ones start at the mean of the old rows."""
    model = build_model(tokenizer, max_positions=MAX_POSITIONS)
    state = {k: v for k, v in base.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("embed_tokens" in k or "lm_head" in k for k in missing), (missing, unexpected)
    old_vocab, new_vocab = base_tokenizer.get_vocab(), tokenizer.get_vocab()
    with torch.no_grad():
        for new, old in ((model.get_input_embeddings(), base.get_input_embeddings()),
                         (model.get_output_embeddings(), base.get_output_embeddings())):
            new.weight[:] = old.weight.mean(0) + 0.02 * torch.randn_like(new.weight)
            for token, i in new_vocab.items():
                if token in old_vocab:
                    new.weight[i] = old.weight[old_vocab[token]]
    return model


def train(model, processor, data: TrainingSet, steps: int, batch_size: int, lr: float, log_every: int = 25):
    """Next-token loss on the answer; the trained vision tower stays frozen (as in LLaVA-1.5's own
    fine-tuning), the projector and the language model learn."""
    model.train()
    rng = random.Random(TRAIN_SEED + 3)
    model.model.vision_tower.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(steps))
    log, running, t0 = [], 0.0, time.time()
    for step in range(1, steps + 1):
        loss = model(**batch(data, processor, batch_size, rng)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running += loss.item()
        if step % log_every == 0 or step == steps:
            n = log_every if step % log_every == 0 else step % log_every
            log.append({"step": step, "loss": round(running / n, 4), "seconds": round(time.time() - t0, 1)})
            print(f"step {step:5d}  loss {running / n:.4f}  {time.time() - t0:6.0f}s", flush=True)
            running = 0.0
    return log


# ---- evaluation ----

def calls_in(text: str) -> list:
    """The hermes blocks of an answer, each parsed JSON (None when it is not)."""
    out = []
    for block in CALL.findall(text):
        try:
            out.append(json.loads(block))
        except ValueError:
            out.append(None)
    return out


def score(case: dict, labels, reply: str) -> dict:
    calls = calls_in(reply)
    if case["kind"] == "question":
        kind = "color" if case["which"] == 0 else "shape"
        return {"text": not calls and "<tool_call>" not in reply, "qa_" + kind: is_correct(reply, labels, kind)}
    if case["arguments"] is None:
        return {"text": not calls and "<tool_call>" not in reply}
    call = calls[0] if len(calls) == 1 and isinstance(calls[0], dict) else {}
    is_call = call.get("name") == case["kind"]
    valid = is_call and jsonschema.Draft202012Validator(TOOLS[case["kind"]]["function"]["parameters"]).is_valid(
        call.get("arguments"))
    return {"call": is_call, "valid": valid, "right": valid and call["arguments"] == case["arguments"]}


@torch.no_grad()
def evaluate(model, processor, count: int, seed: int = EVAL_SEED) -> dict:
    """Greedy answers to `count` fresh cases (canonical question phrasings, one case at a time)."""
    model.eval()
    rng = random.Random(seed)
    samples = list(generate(count, seed=seed))
    tally, wrong = {}, []
    for i in range(count):
        case = draw_case(rng, count)
        case["which"] = i % 2
        image, labels = samples[case["image"]]
        question, _ = answer(case, labels, None)
        text = prompt(processor, case, question)
        inputs = processor(images=[image] if case["with_image"] else None, text=[text], return_tensors="pt")
        out = model.generate(**inputs, do_sample=False, max_new_tokens=48,
                             pad_token_id=processor.tokenizer.pad_token_id)
        reply = processor.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        scored = score(case, labels, reply)
        for key, ok in scored.items():
            right, total = tally.get(key, (0, 0))
            tally[key] = (right + ok, total + 1)
        failed = [key for key, ok in scored.items() if not ok]
        if failed and len(wrong) < 12:
            wrong.append({"kind": case["kind"], "question": question, "answer": reply, "failed": failed[0],
                          "tools": [t["function"]["name"] for t in case["tools"]]})
    names = {"call": "call_when_appropriate", "valid": "arguments_valid", "right": "arguments_right",
             "text": "text_when_appropriate", "qa_color": "color_with_tools", "qa_shape": "shape_with_tools"}
    return {"accuracy": {names[k]: round(r / t, 4) for k, (r, t) in sorted(tally.items())},
            "cases": {names[k]: t for k, (_, t) in sorted(tally.items())}, "wrong_examples": wrong}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--pool", type=int, default=3000, help="training images (each seen many times)")
    parser.add_argument("--eval-count", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base", type=Path, default=BASE, help="the trained tiny LLaVA to start from")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--eval-only", action="store_true", help="re-score the model in --out")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(TORCH_SEED)

    from transformers import AutoProcessor, LlavaForConditionalGeneration
    if not args.eval_only:
        base_processor = AutoProcessor.from_pretrained(args.base)
        processor = build_processor(build_tokenizer(corpus(), CHAT_TEMPLATE_TOOLS, MAX_POSITIONS), CHAT_TEMPLATE_TOOLS)
        model = transplant(LlavaForConditionalGeneration.from_pretrained(args.base), processor.tokenizer,
                           base_processor.tokenizer)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{n_params:,} parameters; vocab {len(processor.tokenizer)}", flush=True)
        t0 = time.time()
        data = TrainingSet(processor, args.pool)
        assert IMAGE_TOKEN in prompt(processor, {"with_image": True, "tools": list(TOOLS.values())}, COLOR_QUESTIONS[0])
        log = train(model, processor, data, args.steps, args.batch_size, args.lr)
        train_seconds = time.time() - t0
        save(model, processor, args.out, CHAT_TEMPLATE_TOOLS)

    # Score what was saved, loaded back the way users load it.
    model = LlavaForConditionalGeneration.from_pretrained(args.out)
    processor = AutoProcessor.from_pretrained(args.out)
    t1 = time.time()
    scores = evaluate(model, processor, args.eval_count)
    print(json.dumps(scores, indent=2), flush=True)
    if args.eval_only:
        return
    metrics = {
        "accuracy": scores["accuracy"],
        "eval": {"cases": scores["cases"], "seed": EVAL_SEED, "decoding": "greedy", "questions": [
            COLOR_QUESTIONS[0], SHAPE_QUESTIONS[0]], "seconds": round(time.time() - t1, 1),
                 "wrong_examples": scores["wrong_examples"]},
        "train": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "vision_tower": "frozen",
                  "seed": TRAIN_SEED, "examples": args.steps * args.batch_size, "seconds": round(train_seconds, 1),
                  "pool_images": args.pool, "threads": args.threads, "dtype": "float32", "loss_log": log[-5:]},
        "base": str(args.base.relative_to(REPO)) if args.base.is_relative_to(REPO) else str(args.base),
        "parameters": n_params,
        "command": "python " + " ".join(shlex.quote(a) for a in [f"scripts/{Path(__file__).name}", *sys.argv[1:]]),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics["accuracy"]), f"train {train_seconds:.0f}s")


if __name__ == "__main__":
    main()
