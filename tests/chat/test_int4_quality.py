"""engine.quantization=int4 on the tiny LLaVA's test questions (48: 24 images, a colour and a shape
question each): how many answers stay bf16's, and accuracy, at the default group size and the finest."""
import pytest

from tests.chat.llava_quality import accuracy, agreement, answers, questions


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
