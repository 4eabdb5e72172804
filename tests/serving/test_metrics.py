"""`/metrics`, parsed with prometheus-client's parser: the counters equal what was served, though the
engine and the HTTP routes live in two processes."""
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import LLAVA_TINY, data_url, image_question, metrics
from tests.server_process import server_process


def delta(before, after, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_counters_equal_what_was_served(llava_server):
    client = openai.OpenAI(base_url=f"{llava_server.base}/v1", api_key="x", max_retries=0, timeout=120)
    before = metrics(llava_server.base)
    answers = [client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()),
                                              max_tokens=n, temperature=0) for n in (1, 3, 40)]
    answers.append(client.completions.create(model="llava-tiny", prompt="The shape is", max_tokens=4,
                                             temperature=0, extra_body={"ignore_eos": True}))
    httpx.post(f"{llava_server.base}/v1/chat/completions", json={"messages": []}, timeout=30)  # a 400
    after = metrics(llava_server.base)

    prompt = sum(a.usage.prompt_tokens for a in answers)
    generated = sum(a.usage.completion_tokens for a in answers)
    assert delta(before, after, "appliance_prompt_tokens_total") == prompt
    assert delta(before, after, "appliance_generation_tokens_total") == generated
    reasons = [a.choices[0].finish_reason for a in answers]
    for reason in ("stop", "length"):
        assert delta(before, after, "appliance_request_success_total", finished_reason=reason) == reasons.count(reason)
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert delta(before, after, f"appliance_{histogram}_count") == 4, histogram
    assert delta(before, after, "appliance_inter_token_latency_seconds_count") == generated - 4
    # vLLM's request-level histograms, one observation per finished request
    assert delta(before, after, "appliance_request_prompt_tokens_count") == 4
    assert delta(before, after, "appliance_request_prompt_tokens_sum") == prompt
    assert delta(before, after, "appliance_request_generation_tokens_sum") == generated
    for histogram in ("prefill", "decode", "inference"):
        assert delta(before, after, f"appliance_request_{histogram}_time_seconds_count") == 4, histogram
    several = sum(a.usage.completion_tokens > 1 for a in answers)
    assert delta(before, after, "appliance_request_time_per_output_token_seconds_count") == several
    decode = delta(before, after, "appliance_request_decode_time_seconds_sum")
    inference = delta(before, after, "appliance_request_inference_time_seconds_sum")
    e2e = delta(before, after, "appliance_e2e_request_latency_seconds_sum")
    assert 0 < decode < inference < e2e  # decode within inference, inference within arrival-to-end
    assert delta(before, after, "appliance_request_params_max_tokens_sum") == 1 + 3 + 40 + 4
    assert delta(before, after, "appliance_http_requests_total", route="/v1/chat/completions", status="200") == 3
    assert delta(before, after, "appliance_http_requests_total", route="/v1/completions", status="200") == 1
    assert delta(before, after, "appliance_http_requests_total", route="/v1/chat/completions", status="400") == 1
    # Three identical image prompts: the encoder cache and the prefix cache were asked and hit.
    assert delta(before, after, "appliance_encoder_cache_hits_total") >= 2
    assert delta(before, after, "appliance_prefix_cache_hits_total") > 0
    assert after[("appliance_num_requests_running", ())] == 0
    assert after[("appliance_kv_cache_usage_perc", ())] == 0


def n_answers_observed(base, prefix):
    """An n=3 completion: `request_params_n` observes 3 once, `request_max_num_generation_tokens` its
    longest answer's tokens (not their sum, which `request_generation_tokens` observes)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)
    before = metrics(base)
    answer = client.completions.create(model="llava-tiny", prompt="The shape is", max_tokens=12, n=3, logprobs=0,
                                       temperature=1.0, seed=7)
    after = metrics(base)
    lengths = [len(choice.logprobs.tokens) for choice in answer.choices]
    assert len(lengths) == 3 and sum(lengths) == answer.usage.completion_tokens
    assert delta(before, after, f"{prefix}request_params_n_count") == 1
    assert delta(before, after, f"{prefix}request_params_n_sum") == 3
    assert delta(before, after, f"{prefix}request_params_n_bucket", le="2.0") == 0  # 3 is above 2
    assert delta(before, after, f"{prefix}request_params_n_bucket", le="5.0") == 1
    assert delta(before, after, f"{prefix}request_max_num_generation_tokens_count") == 1
    assert delta(before, after, f"{prefix}request_max_num_generation_tokens_sum") == max(lengths)
    assert delta(before, after, f"{prefix}request_generation_tokens_sum") == sum(lengths)


def test_n_and_the_longest_answer_are_observed_per_request(llava_server):
    n_answers_observed(llava_server.base, "appliance_")


def test_every_series_is_labelled_with_the_model_name(llava_server):
    httpx.post(f"{llava_server.base}/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=60)
    text = httpx.get(f"{llava_server.base}/metrics", timeout=10).text
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith("appliance_")]
    names = {f.name for f in families}
    for expected in ("appliance_time_to_first_token_seconds", "appliance_inter_token_latency_seconds",
                     "appliance_e2e_request_latency_seconds", "appliance_request_queue_time_seconds",
                     "appliance_num_requests_running", "appliance_num_requests_waiting",
                     "appliance_kv_cache_usage_perc", "appliance_prompt_tokens", "appliance_generation_tokens",
                     "appliance_request_success", "appliance_num_preemptions", "appliance_prefix_cache_queries",
                     "appliance_prefix_cache_hits", "appliance_encoder_cache_queries", "appliance_encoder_cache_hits",
                     "appliance_tiles", "appliance_http_requests"):
        assert expected in names, expected
    for family in families:
        for sample in family.samples:
            assert sample.labels.get("model_name") == "llava-tiny", sample


@pytest.fixture(scope="module")
def vllm_named_server(tmp_path_factory):
    if not (LLAVA_TINY / "config.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is missing")
    with server_process("pipeline=llava_chat", "server.metrics_names=vllm",
                        cwd=tmp_path_factory.mktemp("vllm_names")) as server:
        yield server


def test_vllm_names_export_vllms_series_with_its_model_name_label(vllm_named_server):
    """`server.metrics_names=vllm`: the series vLLM has under its names (what its Grafana dashboards and
    KEDA triggers query), the others under ours, every one labelled model_name."""
    base = vllm_named_server.base
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)
    answer = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), max_tokens=3,
                                            temperature=0, extra_body={"ignore_eos": True})
    text = httpx.get(f"{base}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_success", "vllm:num_preemptions",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_prompt_tokens",
                 "vllm:request_generation_tokens", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                 "vllm:request_time_per_output_token_seconds", "vllm:request_params_max_tokens",
                 "vllm:iteration_tokens_total", "vllm:cache_config_info", "vllm:request_params_n",
                 "vllm:request_max_num_generation_tokens",
                 "appliance_encoder_cache_hits", "appliance_http_requests",  # vLLM has no such series
                 "appliance_iteration_tokens_total"):  # ours, beside vLLM's (docs/serving.md)
        assert name in families, name
    assert not any(name.startswith("appliance_") and name[len("appliance_"):] in {
        "time_to_first_token_seconds", "num_requests_waiting", "prompt_tokens"} for name in families)
    for family in families.values():
        for sample in family.samples:
            assert sample.labels.get("model_name") == "llava-tiny", sample
    after = metrics(base)
    assert after[("vllm:prompt_tokens_total", ())] == answer.usage.prompt_tokens
    assert after[("vllm:generation_tokens_total", ())] == 3
    assert after[("vllm:request_success_total", (("finished_reason", "length"),))] == 1
    assert after[("vllm:request_prompt_tokens_sum", ())] == answer.usage.prompt_tokens
    assert after[("vllm:request_generation_tokens_count", ())] == 1
    assert after[("vllm:request_decode_time_seconds_count", ())] == 1
    assert after[("vllm:inter_token_latency_seconds_count", ())] == 2
    assert after[("vllm:request_params_max_tokens_sum", ())] == 3
    # ours: every token the steps computed, the prompt's not found in the prefix cache and each output
    # token fed back but the last; vLLM's: the whole prompt once and each output token, per step with output
    computed = answer.usage.prompt_tokens - after[("vllm:prefix_cache_hits_total", ())] + 3 - 1
    assert after[("appliance_iteration_tokens_total_sum", ())] == computed
    assert after[("vllm:iteration_tokens_total_sum", ())] == answer.usage.prompt_tokens + 3
    assert after[("vllm:iteration_tokens_total_count", ())] == 3
    (info,) = [labels for name, labels in after if name == "vllm:cache_config_info"]
    assert dict(info)["block_size"] == "16" and dict(info)["enable_prefix_caching"] == "True"


def test_vllm_iteration_tokens_hold_vllms_own_test(vllm_named_server):
    """vLLM's tests/entrypoints/openai/test_metrics.py: n requests of one token-id prompt, one after the
    other, sum to n * (prompt + max_tokens) over n * max_tokens steps, though the prefix cache serves
    every prompt after the first."""
    base = vllm_named_server.base
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)
    prompt, requests, max_tokens = [1] + list(range(100, 140)), 4, 5  # two full KV blocks: cached after the first
    before = metrics(base)
    for _ in range(requests):
        client.completions.create(model="llava-tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                  extra_body={"ignore_eos": True})
    after = metrics(base)
    assert delta(before, after, "vllm:iteration_tokens_total_sum") == requests * (len(prompt) + max_tokens)
    assert delta(before, after, "vllm:iteration_tokens_total_count") == requests * max_tokens
    assert delta(before, after, "vllm:prefix_cache_hits_total") > 0


def test_vllm_names_observe_n_and_the_longest_answer(vllm_named_server):
    n_answers_observed(vllm_named_server.base, "vllm:")
