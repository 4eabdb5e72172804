"""The embedded tiny LLaVA answers its questions in bfloat16 as it does in float32 (engine.dtype=auto
picks bf16 for half precision checkpoints on CPUs with bf16 units): greedy answers to its colour and
shape questions on seeded images, through `appliance run` as a user runs it."""
import json

from tests.chat.conftest import batch_request, clear_samples, synthetic_shapes, write_jsonl
from tests.conftest import run_cli

IMAGES = 12
# Measured when written (24 answers): the colour or shape named agreed 24 of 24; the exact text 21 of 24,
# the three others phrased alike ("This is a star." / "It is a star."): the model was trained on both
# phrasings, whose first tokens are nearly tied, and bf16 rounding tips the tie.
MIN_LABEL_AGREEMENT = 0.95
MIN_TEXT_AGREEMENT = 0.75


def answers(batch, out, dtype):
    result = run_cli("run", "pipeline=llava_chat", "plugins=[appliance.stages.chat]", f"input={batch}",
                     f"output={out}", f"engine.dtype={dtype}", timeout=600)
    assert result.returncode == 0, result.stderr
    return {line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
            for line in map(json.loads, out.read_text().splitlines())}


def test_bf16_answers_agree_with_fp32(tmp_path):
    shapes = synthetic_shapes()
    lines = []
    for i, (image, _) in enumerate(clear_samples(shapes, IMAGES, first_seed=3000)):
        image.save(tmp_path / f"{i}.png")
        for kind, question in (("color", shapes.COLOR_QUESTIONS[0]), ("shape", shapes.SHAPE_QUESTIONS[0])):
            content = [{"type": "image_url", "image_url": {"url": str(tmp_path / f"{i}.png")}},
                       {"type": "text", "text": question}]
            lines.append(batch_request(f"{i}-{kind}", content, max_tokens=12, temperature=0))
    batch = write_jsonl(tmp_path / "requests.jsonl", lines)
    fp32 = answers(batch, tmp_path / "fp32.jsonl", "float32")
    bf16 = answers(batch, tmp_path / "bf16.jsonl", "bfloat16")
    assert fp32.keys() == bf16.keys() and len(fp32) == 2 * IMAGES
    differ = {k: (fp32[k], bf16[k]) for k in fp32 if fp32[k] != bf16[k]}
    same_text = len(fp32) - len(differ)
    same_label = sum(named(fp32[k]) == named(bf16[k]) for k in fp32)
    assert same_label / len(fp32) >= MIN_LABEL_AGREEMENT, f"{same_label} of {len(fp32)} name the same; {differ}"
    assert same_text / len(fp32) >= MIN_TEXT_AGREEMENT, f"{same_text} of {len(fp32)} answers agree; {differ}"


def named(answer: str) -> str:
    """The colour or shape an answer names: its last word ("It is a star." -> "star")."""
    words = answer.strip().rstrip(".").split()
    return words[-1].lower() if words else ""
