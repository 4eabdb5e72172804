"""engine.quantization=int8 on the tiny LLaVA's test questions: accuracy within 2 points of fp32."""
from tests.chat.llava_quality import accuracy, agreement, answers, questions


def test_int8_answers_as_well_as_fp32(tmp_path):
    lines = questions(40)
    full = answers(tmp_path, lines)
    int8 = answers(tmp_path, lines, ["engine.quantization=int8"])
    print(f"tiny LLaVA, {len(lines)} questions: fp32 accuracy {accuracy(full):.3f}, int8 {accuracy(int8):.3f}, "
          f"greedy answers identical {agreement(full, int8):.3f}")
    assert accuracy(full) >= 0.85, "the tiny LLaVA itself answers its test questions"
    assert accuracy(int8) >= accuracy(full) - 0.02
    assert agreement(full, int8) >= 0.8
