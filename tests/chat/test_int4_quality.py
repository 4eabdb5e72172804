"""engine.quantization=int4 on the tiny LLaVA's test questions (48: 24 images, a colour and a shape
question each): how many answers stay bf16's, and accuracy, at the default group size and the finest, and
from an AWQ checkpoint of the same model (its layout as AutoAWQ writes it, min/max groups)."""
import pytest

from tests.chat.llava_quality import accuracy, agreement, answers, questions
from tests.engine.helpers import write_awq_checkpoint


@pytest.mark.parametrize("group_size", [128, 32])
def test_int4_answers_as_bf16_does(tmp_path, group_size):
    lines = questions(24)
    bf16 = answers(tmp_path, lines, ["engine.dtype=bfloat16"])
    int4 = answers(tmp_path, lines, ["engine.dtype=bfloat16", "engine.quantization=int4",
                                     f"engine.quantization_group_size={group_size}"])
    same = round(agreement(bf16, int4) * len(lines))
    print(f"tiny LLaVA, {len(lines)} questions: bf16 accuracy {accuracy(bf16):.3f}, int4 (groups of {group_size}) "
          f"{accuracy(int4):.3f}, greedy answers identical {same} of {len(lines)}")
    assert accuracy(bf16) >= 0.85, "the tiny LLaVA itself answers its test questions"
    assert same >= 46


def test_an_awq_checkpoint_answers_as_bf16_does(tmp_path):
    """Groups of 128, AWQ's usual size; its zero is an integer (ours is not), so its answers need not be
    int4-at-load's, but they are held to the same bar against bf16."""
    lines = questions(24)
    bf16 = answers(tmp_path, lines, ["engine.dtype=bfloat16"])
    checkpoint = write_awq_checkpoint(tmp_path / "awq", 128)
    awq = answers(tmp_path, lines, ["engine.dtype=bfloat16", f"model.path={checkpoint}"])
    same = round(agreement(bf16, awq) * len(lines))
    print(f"tiny LLaVA, {len(lines)} questions: bf16 accuracy {accuracy(bf16):.3f}, AWQ (groups of 128) "
          f"{accuracy(awq):.3f}, greedy answers identical {same} of {len(lines)}")
    assert same >= 46
