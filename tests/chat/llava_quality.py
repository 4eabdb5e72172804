"""The tiny LLaVA's test questions (the colour and the shape of held-out synthetic images, as
scripts/train_tiny_llava.py scores it) answered by the whole llava_chat pipeline under some engine
overrides: what a change of dtype or quantization costs in accuracy, and how often it changes an answer."""
import json
from typing import Dict, List, Sequence

from appliance.config.compose import compose
from appliance.stages.build import build_pipeline
from tests.chat.conftest import batch_request, synthetic_shapes, write_jsonl
from tests.servers import png_data_url


def questions(count: int, seed: int = 777) -> List[dict]:
    """Batch-file lines, a colour and a shape question per image, with the truth in `custom_id`."""
    shapes = synthetic_shapes()
    lines = []
    for i, (image, labels) in enumerate(shapes.generate(count, seed=seed)):
        url = png_data_url(image)
        for kind, question, truth in (("color", shapes.COLOR_QUESTIONS[0], labels.color),
                                      ("shape", shapes.SHAPE_QUESTIONS[0], labels.shape)):
            lines.append(batch_request(f"{i}:{kind}:{truth}", [{"type": "image_url", "image_url": {"url": url}},
                                                                {"type": "text", "text": question}],
                                       max_tokens=12, temperature=0))
    return lines


def answers(tmp_path, lines: Sequence[dict], overrides: Sequence[str] = ()) -> Dict[str, str]:
    """{custom_id: answer} from one offline batch run with `overrides`."""
    name = "-".join(o.replace("=", "_").replace(".", "_").replace("/", "_") for o in overrides) or "default"
    output = tmp_path / f"answers-{name}.jsonl"
    pipeline = build_pipeline(compose(["pipeline=llava_chat", *overrides]))
    try:
        list(pipeline.run([{"input": str(write_jsonl(tmp_path / f"q-{name}.jsonl", lines)),
                            "output": str(output), "prompt": None}]))
    finally:
        pipeline.close()
    rows = (json.loads(line) for line in output.open())
    return {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in rows}


def accuracy(answered: Dict[str, str]) -> float:
    """Share of answers that name the truth and no other colour or shape (the training script's rule)."""
    shapes = synthetic_shapes()
    right = 0
    for custom_id, answer in answered.items():
        _, kind, truth = custom_id.split(":")
        options = set(shapes.COLORS) if kind == "color" else set(shapes.SHAPES)
        words = set(answer.lower().replace(".", " ").split())
        right += truth in words and not (words & (options - {truth}))
    return right / len(answered)


def agreement(a: Dict[str, str], b: Dict[str, str]) -> float:
    return sum(a[k] == b[k] for k in a) / len(a)
