"""engine.quantization=int4 on the tiny LLaVA's test questions (48: 24 images, a colour and a shape
question each): how many answers stay bf16's, and accuracy, at the default group size and the finest, and
from AWQ and GPTQ checkpoints of the same model (their layouts as AutoAWQ and AutoGPTQ write them, min/max
or symmetric groups)."""
import pytest

from tests.chat.llava_quality import accuracy, agreement, answers, questions
from tests.engine.helpers import write_awq_checkpoint, write_gptq_checkpoint


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


@pytest.mark.parametrize("name, write, options", [
    ("AWQ", write_awq_checkpoint, {}),
    ("GPTQ", write_gptq_checkpoint, {}),
    ("GPTQ symmetric", write_gptq_checkpoint, {"sym": True}),
])
def test_a_quantised_checkpoint_answers_as_bf16_does(tmp_path, name, write, options):
    """Groups of 128, the formats' usual size; their zero is an integer (ours is not), so their answers
    need not be int4-at-load's, but they are held to the same bar against bf16."""
    lines = questions(24)
    bf16 = answers(tmp_path, lines, ["engine.dtype=bfloat16"])
    checkpoint = write(tmp_path / "quantised", 128, **options)
    quantised = answers(tmp_path, lines, ["engine.dtype=bfloat16", f"model.path={checkpoint}"])
    same = round(agreement(bf16, quantised) * len(lines))
    print(f"tiny LLaVA, {len(lines)} questions: bf16 accuracy {accuracy(bf16):.3f}, {name} (groups of 128) "
          f"{accuracy(quantised):.3f}, greedy answers identical {same} of {len(lines)}")
    assert same >= 46
