#!/usr/bin/env python
"""Train the embedded demo VLM (conf/model/llava_tiny.yaml): a tiny LLaVA-1.5 of the real architecture.

transformers' `LlavaForConditionalGeneration` (tiny CLIP vision tower + 2-layer GELU projector + tiny
Llama) learns to answer "What color is the shape?" / "What shape is this?" about the images of
scripts/synthetic_shapes.py. transformers is both the trainer and the reference: inputs come from the
saved `AutoProcessor` (scripts/tiny_llava_files.py: LLaVA-1.5 chat template, pad-to-square CLIP preprocessing,
`<image>` expanded to
IMAGE_TOKENS placeholders), the loss covers only the answer tokens and the final `</s>`, and the
held-out score uses `generate` with greedy decoding.

Data: training images come from one seeded stream (TRAIN_SEED): a pool run once through the processor,
each draw one image (mirrored half the time) with one of its two questions, phrasings drawn at random.
Stage 1 pretrains the vision tower alone (a linear probe on its features, standing in for CLIP's
pretraining); stage 2 trains the whole LLaVA on the answers. Evaluation uses EVAL_SEED, which training
never sees, and the first (canonical) phrasings. An answer is right when it names the right colour (shape) and no
other colour (shape). Writes a `save_pretrained` directory (config, safetensors, tokenizer, processor)
plus metrics.json.

    .venv/bin/python scripts/train_tiny_llava.py                      # the committed model
    .venv/bin/python scripts/train_tiny_llava.py --eval-only          # re-score the committed model
    .venv/bin/python scripts/train_tiny_llava.py --steps 200 --out /tmp/llava_tiny
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_shapes import COLOR_QUESTIONS, COLORS, SHAPE_QUESTIONS, SHAPES, generate, qa_pairs
from tiny_llava_files import (IMAGE_TOKEN, IMAGE_TOKENS, build_model, build_processor,
                              build_tokenizer, save)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "appliance" / "assets" / "models" / "llava_tiny"
TRAIN_SEED, EVAL_SEED, TORCH_SEED = 0, 2_000_001, 0


# ---- data ----

def prompt_text(processor, question: str) -> str:
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return processor.apply_chat_template(conversation, add_generation_prompt=True)


def answer_ids(tokenizer, prompt_ids: list[int], prompt: str, answer: str) -> list[int]:
    """Token ids of `prompt + " " + answer + "</s>"` (image placeholders expanded), checked to start
    with `prompt_ids` so that the loss mask can cut at len(prompt_ids)."""
    ids = tokenizer(_expand(tokenizer, prompt) + f" {answer}{tokenizer.eos_token}")["input_ids"]
    if ids[:len(prompt_ids)] != prompt_ids:
        raise RuntimeError(f"prompt tokens are not a prefix of prompt + answer: {prompt!r} + {answer!r}")
    return ids


def _expand(tokenizer, prompt: str) -> str:
    """What LlavaProcessor does to the text: one `<image>` becomes IMAGE_TOKENS of them."""
    return prompt.replace(IMAGE_TOKEN, IMAGE_TOKEN * IMAGE_TOKENS)


class TrainingSet:
    """A pool of `count` images (seed TRAIN_SEED) run once through the processor's image half (kept
    as float16), and the token ids of every (question, answer) phrasing; `batch` draws images with
    replacement, one of their two questions each, phrasings at random, mirrored half the time."""

    def __init__(self, processor, count: int, seed: int = TRAIN_SEED, chunk: int = 256):
        self.tokenizer = processor.tokenizer
        self.labels, pixels = [], []
        stream = generate(count, seed=seed)
        for start in range(0, count, chunk):
            part = [next(stream) for _ in range(min(chunk, count - start))]
            self.labels += [labels for _, labels in part]
            pixels.append(processor.image_processor([im for im, _ in part], return_tensors="pt")
                          ["pixel_values"].to(torch.float16))
        self.pixels = torch.cat(pixels)
        self.prompts = {q: prompt_text(processor, q) for q in (*COLOR_QUESTIONS, *SHAPE_QUESTIONS)}
        self.prompt_ids = {q: self.tokenizer(_expand(self.tokenizer, p))["input_ids"]
                           for q, p in self.prompts.items()}
        self._check_against_processor(processor)

    def example_ids(self, question: str, answer: str) -> tuple[list[int], int]:
        prompt_ids = self.prompt_ids[question]
        return answer_ids(self.tokenizer, prompt_ids, self.prompts[question], answer), len(prompt_ids)

    def _check_against_processor(self, processor) -> None:
        """Our text path gives the ids and pixels that `processor(images=, text=)` gives."""
        image, labels = next(generate(1, seed=TRAIN_SEED))
        question, answer = qa_pairs(labels)[0]
        text = f"{self.prompts[question]} {answer}{self.tokenizer.eos_token}"
        reference = processor(images=[image], text=[text], return_tensors="pt")
        assert reference["input_ids"][0].tolist() == self.example_ids(question, answer)[0]
        assert torch.allclose(reference["pixel_values"][0].half(), self.pixels[0])

    def batch(self, size: int, rng: random.Random) -> dict:
        rows, idx = [], []
        for _ in range(size):
            i = rng.randrange(len(self.labels))
            question, answer = rng.choice(qa_pairs(self.labels[i], rng))
            rows.append(self.example_ids(question, answer))
            idx.append(i)
        pixels = self.pixels[idx].float()
        flip = torch.tensor([rng.random() < 0.5 for _ in idx])
        pixels[flip] = pixels[flip].flip(-1)
        return collate(rows, pixels, self.tokenizer.pad_token_id)


def collate(rows: list[tuple[list[int], int]], pixel_values: torch.Tensor, pad_id: int) -> dict:
    """Right-pad (ids, prompt_length) rows; labels are -100 on the prompt and the padding."""
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full_like(input_ids, -100)
    mask = torch.zeros_like(input_ids)
    for r, (ids, prompt_len) in enumerate(rows):
        input_ids[r, :len(ids)] = torch.tensor(ids)
        labels[r, prompt_len:len(ids)] = input_ids[r, prompt_len:len(ids)]
        mask[r, :len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels, "pixel_values": pixel_values}


# ---- evaluation ----

def is_correct(answer: str, labels, kind: str) -> bool:
    """The answer names the right colour (shape) and no other one."""
    words = set(answer.lower().replace(".", " ").split())
    right, options = (labels.color, COLORS) if kind == "color" else (labels.shape, SHAPES)
    return right in words and not (words & (set(options) - {right}))


@torch.no_grad()
def answer_questions(model, processor, images, question: str, max_new_tokens: int = 12) -> list[str]:
    """Greedy answers to one question about each image (one prompt length: no padding needed)."""
    prompt = prompt_text(processor, question)
    inputs = processor(images=list(images), text=[prompt] * len(images), return_tensors="pt")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=processor.tokenizer.pad_token_id)
    return processor.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def evaluate(model, processor, count: int = 200, seed: int = EVAL_SEED, batch: int = 50) -> dict:
    samples = list(generate(count, seed=seed))
    model.eval()
    result, examples = {}, []
    for kind, question in (("color", COLOR_QUESTIONS[0]), ("shape", SHAPE_QUESTIONS[0])):
        right = 0
        for start in range(0, count, batch):
            chunk = samples[start:start + batch]
            answers = answer_questions(model, processor, [im for im, _ in chunk], question)
            for (_, labels), answer in zip(chunk, answers):
                ok = is_correct(answer, labels, kind)
                right += ok
                if not ok and len(examples) < 10:
                    examples.append({"question": question, "answer": answer,
                                     "truth": getattr(labels, kind), "image_size": labels.image_size})
        result[kind] = right / count
    result["overall"] = (result["color"] + result["shape"]) / 2
    result["wrong_examples"] = examples
    return result


# ---- training ----

def pretrain_vision(model, data: TrainingSet, steps: int, batch_size: int, lr: float, log_every: int = 100) -> dict:
    """Stage 1, standing in for CLIP's pretraining: the vision tower alone learns to tell colours and
    shapes, through a throwaway linear probe on its mean-pooled selected features (layer -2, CLS
    dropped: what the projector will read). Without it the LM spends thousands of steps on the
    language prior before it starts to look at the image."""
    tower = model.model.vision_tower
    classes = {"color": sorted(COLORS), "shape": list(SHAPES)}
    probe = torch.nn.Linear(tower.config.hidden_size, len(classes["color"]) + len(classes["shape"]))
    params = list(tower.parameters()) + list(probe.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.05, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(steps))
    rng, t0, seen, right, last_acc = random.Random(TRAIN_SEED + 2), time.time(), 0, 0, None
    tower.train()
    for step in range(1, steps + 1):
        idx = [rng.randrange(len(data.labels)) for _ in range(batch_size)]
        pixels = data.pixels[idx].float()
        flip = torch.tensor([rng.random() < 0.5 for _ in idx])
        pixels[flip] = pixels[flip].flip(-1)
        color = torch.tensor([classes["color"].index(data.labels[i].color) for i in idx])
        shape = torch.tensor([classes["shape"].index(data.labels[i].shape) for i in idx])
        hidden = tower(pixels, output_hidden_states=True).hidden_states[-2][:, 1:]
        logits = probe(hidden.mean(dim=1))
        n_color = len(classes["color"])
        loss = (torch.nn.functional.cross_entropy(logits[:, :n_color], color)
                + torch.nn.functional.cross_entropy(logits[:, n_color:], shape))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        seen += batch_size
        right += torch.stack([logits[:, :n_color].argmax(1) == color, logits[:, n_color:].argmax(1) == shape]).sum(1)
        if step % log_every == 0 or step == steps:
            last_acc = dict(zip(("color", "shape"), (right / seen).tolist()))
            print(f"vision step {step:5d}  loss {loss.item():.4f}  probe accuracy colour {last_acc['color']:.3f} "
                  f"shape {last_acc['shape']:.3f}  {time.time() - t0:5.0f}s", flush=True)
            seen, right = 0, 0
    return {"steps": steps, "batch_size": batch_size, "lr": lr, "probe_accuracy_last_window": last_acc,
            "seconds": round(time.time() - t0, 1)}


def _warmup_cosine(steps: int):
    warmup = max(1, steps // 20)
    return lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))


def train(model, data: TrainingSet, steps: int, batch_size: int, lr: float, vision_lr_scale: float = 0.25,
          log_every: int = 50) -> list[dict]:
    """Stage 2, all weights: next-token loss on the answer. The pretrained tower learns at lr * scale."""
    model.train()
    rng = random.Random(TRAIN_SEED + 1)
    tower = set(id(p) for p in model.model.vision_tower.parameters())
    groups = {}
    for p in model.parameters():
        key = (id(p) in tower, p.dim() >= 2)
        groups.setdefault(key, []).append(p)
    opt = torch.optim.AdamW([{"params": ps, "lr": lr * (vision_lr_scale if is_tower else 1.0),
                              "weight_decay": 0.05 if is_matrix else 0.0}
                             for (is_tower, is_matrix), ps in groups.items()], lr=lr, betas=(0.9, 0.98))
    params = [p for ps in groups.values() for p in ps]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(steps))
    log, running, t0 = [], 0.0, time.time()
    for step in range(1, steps + 1):
        loss = model(**data.batch(batch_size, rng)).loss
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--vision-steps", type=int, default=3200, help="stage 1: vision tower + linear probe")
    parser.add_argument("--vision-lr", type=float, default=3e-3)
    parser.add_argument("--vision-batch-size", type=int, default=64)
    parser.add_argument("--pool", type=int, default=12000, help="training images (each seen many times)")
    parser.add_argument("--eval-count", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--eval-only", action="store_true", help="re-score the model in --out")
    parser.add_argument("--init-from", type=Path, help="continue from a saved model (both stages run again)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(TORCH_SEED)

    from transformers import AutoProcessor, LlavaForConditionalGeneration
    if args.eval_only:
        model = LlavaForConditionalGeneration.from_pretrained(args.out)
        processor = AutoProcessor.from_pretrained(args.out)
        print(json.dumps(evaluate(model, processor, args.eval_count), indent=2))
        return

    previous = None
    if args.init_from:
        previous = json.loads((args.init_from / "metrics.json").read_text())
        previous = {k: previous.get(k) for k in ("command", "vision_pretrain", "train", "previous")}
        processor = AutoProcessor.from_pretrained(args.init_from)
        model = LlavaForConditionalGeneration.from_pretrained(args.init_from)
    else:
        processor = build_processor(build_tokenizer())
        model = build_model(processor.tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params:,} parameters; vocab {len(processor.tokenizer)}; {IMAGE_TOKENS} image tokens", flush=True)
    t0 = time.time()
    data = TrainingSet(processor, args.pool)
    print(f"{args.pool} training images prepared in {time.time() - t0:.0f}s", flush=True)
    stage1 = pretrain_vision(model, data, args.vision_steps, args.vision_batch_size, args.vision_lr)
    log = train(model, data, args.steps, args.batch_size, args.lr)
    train_seconds = time.time() - t0
    save(model, processor, args.out)

    # Score what was saved, loaded back the way users load it.
    model = LlavaForConditionalGeneration.from_pretrained(args.out)
    processor = AutoProcessor.from_pretrained(args.out)
    t1 = time.time()
    scores = evaluate(model, processor, args.eval_count)
    metrics = {
        "accuracy": {k: scores[k] for k in ("color", "shape", "overall")},
        "eval": {"images": args.eval_count, "questions_per_image": 2, "seed": EVAL_SEED, "decoding": "greedy",
                 "seconds": round(time.time() - t1, 1), "wrong_examples": scores["wrong_examples"]},
        "vision_pretrain": stage1,
        "train": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "vision_lr_scale": 0.25,
                  "seed": TRAIN_SEED,
                  "examples": args.steps * args.batch_size, "seconds": round(train_seconds, 1),
                  "pool_images": args.pool,
                  "threads": args.threads, "dtype": "float32", "loss_log": log[-5:]},
        "parameters": n_params,
        "previous": previous,  # the run continued with --init-from, if any
        "command": "python " + " ".join(shlex.quote(a) for a in [f"scripts/{Path(__file__).name}", *sys.argv[1:]]),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics["accuracy"]), f"train {train_seconds:.0f}s")


if __name__ == "__main__":
    main()
