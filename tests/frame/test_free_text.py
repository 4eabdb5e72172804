"""Free-text keys (`prompt=`, `system=`, `prompt_file=`) reach the pipeline exactly as the shell passed
them: past Hydra's override grammar and OmegaConf's interpolation, whatever they hold."""
import pytest

from appliance.config.compose import compose
from appliance.config.free_text import literal, split_free_text
from appliance.config.schema import free_text_keys
from appliance.errors import ConfigError
from appliance.stages.chat.requests import plan_run
from tests.conftest import assert_config_error

CORPUS = [
    "What's this?",
    "What's this? (a=b, [c])",
    "Hello, who are you?",
    'She said "hi", then \'bye\'',
    "key=value=more",
    "a,b,,c",
    "[1, 2, 3]",
    "{a: 1, b: [2]}",
    "(parentheses) and <angles>",
    "${model.name}",
    "${oc.env:HOME} and ${undefined.key}",
    "\\${escaped} and \\\\${double}",
    "back\\slash and trailing\\",
    "line one\nline two\n\nline four",
    "tab\there",
    "  leading and trailing spaces  ",
    "non-ASCII: é ü 图像 🚀 Ωμέγα",
    "~tilde +plus ++plusplus",
    "null",
    "true",
    "42",
    "",
    "=",
    "'",
    '"',
    "$",
    "${",
    "}",
    "#hash # comment?",
    "a: b",
    "- item",
    "%percent% and *star* and &amp; and !bang",
]


def test_the_free_text_keys_are_declared_in_the_schema():
    assert free_text_keys() == ["prompt", "prompt_file", "system"]


@pytest.mark.parametrize("text", CORPUS)
def test_a_prompt_composes_verbatim(text):
    cfg = compose(["pipeline=llava_chat", f"prompt={text}", f"system={text}"])
    assert cfg.prompt == text and cfg.system == text
    assert type(cfg.prompt) is str  # "42", "true", "null" stay texts


@pytest.mark.parametrize("text", CORPUS)
def test_literal_reads_back_as_the_text_wherever_it_is_resolved(text):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"x": 1, "p": None})
    cfg.p = literal(text)
    assert cfg.p == text and OmegaConf.to_container(cfg, resolve=True)["p"] == text


def test_the_run_record_carries_the_text_into_the_request():
    """What `appliance run` hands the pipeline (cli._run's record from pipeline.inputs)."""
    text = "What's this? (a=b, [c]) ${x}\n  é"
    cfg = compose(["pipeline=llava_chat", f"prompt={text}", "system=Be brief, 'please'."])
    record = {field: cfg.get(field) for field in cfg.pipeline.inputs}
    (request,), _, _, _ = plan_run(record, None)
    assert request.messages == [{"role": "system", "content": "Be brief, 'please'."},
                                {"role": "user", "content": [{"type": "text", "text": text}]}]


def test_a_prompt_file_path_is_taken_verbatim_too(tmp_path):
    path = tmp_path / "q (1), [draft]=v2.txt"
    cfg = compose(["pipeline=llava_chat", f"prompt_file={path}"])
    assert cfg.prompt_file == str(path)


def test_free_text_beside_other_overrides_and_in_any_position():
    cfg = compose(["prompt=a, b", "pipeline=llava_chat", "engine.max_num_seqs=3"])
    assert cfg.prompt == "a, b" and cfg.engine.max_num_seqs == 3 and cfg.pipeline.name == "llava_chat"


def test_a_free_text_key_given_twice_is_refused():
    assert_config_error(["pipeline=llava_chat", "prompt=a", "prompt=b"], "prompt: given twice")


def test_only_exact_free_text_keys_are_taken_out():
    rest, texts = split_free_text(["prompt=x=y", "prompts=1", "+prompt=z", "model.prompt=1", "prompt"])
    assert texts == {"prompt": "x=y"}
    assert rest == ["prompts=1", "+prompt=z", "model.prompt=1", "prompt"]
    with pytest.raises(ConfigError):
        compose(["pipeline=llava_chat", "prompts=1"])  # still an unknown key, refused as before
