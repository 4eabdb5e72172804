"""vLLM's `/tokenize` and `/detokenize` against a real `appliance serve pipeline=llava_chat`: the tokens are
the tokenizer's, a chat's image counts as the placeholder tokens a chat completion runs, and bad bodies
are refused naming the field."""
import json

import httpx
import pytest
from transformers import AutoTokenizer

from tests.servers import API_KEY, LLAVA_TINY, data_url, error, image_question

TEXT = "The shape is a red circle"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(LLAVA_TINY)


def post(server, path, **body):
    return httpx.post(f"{server.base}{path}", json=body, timeout=60)


def test_text_tokens_are_the_tokenizers_and_detokenize_round_trips(llava_server, tokenizer):
    answer = post(llava_server, "/tokenize", model="llava-tiny", prompt=TEXT, return_token_strs=True)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tokens"] == tokenizer.encode(TEXT) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 256  # the tiny model's context
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(body["tokens"])
    bare = post(llava_server, "/tokenize", prompt=TEXT, add_special_tokens=False).json()
    assert bare["tokens"] == tokenizer.encode(TEXT, add_special_tokens=False) and bare["token_strs"] is None
    assert bare["count"] == body["count"] - 1  # no BOS
    back = post(llava_server, "/detokenize", model="llava-tiny", tokens=bare["tokens"])
    assert back.status_code == 200 and back.json() == {"prompt": TEXT}


def test_a_chat_with_an_image_counts_its_placeholder_tokens(llava_server, tokenizer):
    config = json.loads((LLAVA_TINY / "config.json").read_text())
    vision = config["vision_config"]
    image_tokens = (vision["image_size"] // vision["patch_size"]) ** 2  # CLS dropped: the `default` strategy
    messages = image_question(data_url())
    body = post(llava_server, "/tokenize", model="llava-tiny", messages=messages).json()
    assert body["count"] == len(body["tokens"])
    assert body["tokens"].count(config["image_token_index"]) == image_tokens == 64
    # exactly what a chat completion with the same messages runs
    chat = post(llava_server, "/v1/chat/completions", model="llava-tiny", messages=messages, max_tokens=1).json()
    assert chat["usage"]["prompt_tokens"] == body["count"]
    # without the assistant's opening (the template's "ASSISTANT:"); text alone has no placeholders
    no_opening = post(llava_server, "/tokenize", messages=messages, add_generation_prompt=False).json()
    assert tokenizer.decode(body["tokens"]).endswith("ASSISTANT:")
    assert not tokenizer.decode(no_opening["tokens"]).endswith("ASSISTANT:")
    assert no_opening["tokens"].count(config["image_token_index"]) == 64
    text_only = post(llava_server, "/tokenize", messages=[{"role": "user", "content": "What color is the shape?"}])
    assert config["image_token_index"] not in text_only.json()["tokens"]


def test_continue_final_message_leaves_the_answer_open(llava_server, tokenizer):
    messages = [{"role": "user", "content": "What color is the shape?"},
                {"role": "assistant", "content": "The shape is"}]
    body = post(llava_server, "/tokenize", messages=messages, continue_final_message=True)
    assert body.status_code == 200, body.text
    assert tokenizer.decode(body.json()["tokens"]).endswith("ASSISTANT: The shape is")
    both = post(llava_server, "/tokenize", messages=messages, continue_final_message=True, add_generation_prompt=True)
    assert both.status_code == 400 and error(both)["param"] == "continue_final_message"


def test_a_chat_past_the_context_is_counted_not_refused(llava_server):
    long = " ".join(["circle"] * 300)
    body = post(llava_server, "/tokenize", messages=[{"role": "user", "content": long}]).json()
    assert body["count"] > body["max_model_len"]  # the client compares, as with vLLM
    refused = post(llava_server, "/v1/chat/completions", messages=[{"role": "user", "content": long}])
    assert refused.status_code == 400  # a chat completion of it would not fit


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": 1}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "x", "max_tokens": 3}, 400, "max_tokens"),
    ("/tokenize", {"messages": [{"role": "user", "content": []}]}, 400, "messages[0].content"),
    ("/tokenize", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400,
     "messages[0].content[0].image_url"),
    ("/detokenize", {"tokens": [1, 429]}, 400, "tokens"),          # the vocabulary is 0..428
    ("/detokenize", {"tokens": [1, 10 ** 12]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {}, 400, "tokens"),
    ("/tokenize", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("/detokenize", {"model": "gpt-4", "tokens": [1]}, 404, "model"),
])
def test_bad_bodies_name_the_field(llava_server, path, body, status, param):
    answer = httpx.post(f"{llava_server.base}{path}", json=body, timeout=60)
    assert answer.status_code == status, answer.text
    assert error(answer)["param"] == param, answer.text


def test_the_routes_are_in_the_openapi_document(llava_server):
    schema = httpx.get(f"{llava_server.base}/openapi.json", timeout=10).json()
    tokenize = schema["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert [option["required"] for option in tokenize["oneOf"]] == [["prompt"], ["messages"]]
    assert "/detokenize" in schema["paths"]


def test_a_pooling_server_has_no_tokenize_routes(flood_server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    for path in ("/tokenize", "/detokenize"):
        answer = httpx.post(f"{flood_server.base}{path}", json={"prompt": "x"}, headers=headers, timeout=10)
        assert answer.status_code == 404 and "no such route" in error(answer)["message"]


def test_tokenizer_info_is_vllms_and_serves_lm_evals_remote_tokenizer(llava_server, tokenizer):
    """vLLM's `GET /tokenizer_info` shape, and what lm-eval's RemoteTokenizer does with it: it reads the
    special tokens and the chat template, then finds each special token's id through /tokenize."""
    from appliance.protocol.tokenize import TokenizerInfoResponse

    answer = httpx.get(f"{llava_server.base}/tokenizer_info", timeout=60)
    assert answer.status_code == 200, answer.text
    info = answer.json()
    TokenizerInfoResponse.model_validate(info)
    assert info["tokenizer_class"] == type(tokenizer).__name__
    assert (info["eos_token"], info["bos_token"], info["pad_token"]) == (
        tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token)
    assert info["chat_template"] == tokenizer.chat_template and info["model_max_length"] == 256
    assert info["added_tokens_decoder"][str(tokenizer.eos_token_id)] == tokenizer.eos_token
    assert not {"name_or_path", "vocab_file", "merges_file"} & set(info), "no server paths"
    eos = post(llava_server, "/tokenize", prompt=info["eos_token"], add_special_tokens=False).json()["tokens"]
    assert eos[0] == tokenizer.eos_token_id


def test_a_pooling_server_has_no_tokenizer_info(flood_server):
    answer = httpx.get(f"{flood_server.base}/tokenizer_info", headers={"Authorization": f"Bearer {API_KEY}"},
                       timeout=30)
    assert answer.status_code == 404 and "/pooling" in answer.json()["error"]["message"]
