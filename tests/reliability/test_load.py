"""Load: a disconnect storm, memory pressure and overload, on real servers of the tiny Llama.

Every answer is greedy with a forced length, so an answer depends on its prompt alone: the same text
whether the request ran alone, in a batch of 64, through preemption, or beside 100 clients that hung up.
"""
import asyncio
import concurrent.futures
import random
import threading
import time

import httpx
import pytest

from tests.reliability.conftest import PLUGIN
from tests.reliability.load import answer, counter, session_rss_bytes, stream_text
from tests.reliability.models import overrides
from tests.server_process import server_process
from tests.geo.hls import RangeServer
from tests.servers import SAMPLE_SCENE, error, metrics, wait_for_metric, wait_idle

PROMPTS = [f"Tell me about item {i} and the {w}" for i, w in enumerate(
    "river stone cloud lamp field door wheel bread glass road".split() * 2)]


@pytest.fixture(scope="module")
def alone(storm_server):
    """Each prompt's answer when it runs alone."""
    return {prompt: answer(storm_server.base, prompt) for prompt in PROMPTS}


def test_disconnect_storm(storm_server, alone):
    """200 streams at once, half cut off at random points: the rest answer as alone; nothing is left."""
    rng = random.Random(0)
    plan = [(PROMPTS[i % len(PROMPTS)], rng.randint(1, 12) if i % 2 else None) for i in range(200)]
    before = metrics(storm_server.base)

    async def storm():
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            return await asyncio.gather(*[stream_text(client, storm_server.base, p, cut) for p, cut in plan])

    texts = asyncio.run(storm())
    for (prompt, cut), text in zip(plan, texts):
        if cut is None:
            assert text == alone[prompt], prompt
    after = wait_idle(storm_server.base)
    assert after[("appliance_num_requests_running", ())] == 0
    assert after[("appliance_num_requests_waiting", ())] == 0
    assert after[("appliance_kv_cache_usage_perc", ())] == 0
    finished = {reason: counter(after, "appliance_request_success_total", finished_reason=reason)
                - counter(before, "appliance_request_success_total", finished_reason=reason)
                for reason in ("length", "abort")}
    assert finished["length"] + finished["abort"] == 200 and finished["abort"] >= 50, finished
    assert httpx.get(f"{storm_server.base}/health", timeout=10).status_code == 200


def test_memory_pressure_preempts_and_still_answers_exactly(tiny_model, alone, tmp_path):
    """The KV pool holds a tenth of what 64 concurrent answers need: all 64 finish, through preemption,
    each identical to its answer alone."""
    per_request = 3  # blocks of 16 tokens: a ~12-token prompt + 32 answer tokens
    blocks = 64 * per_request // 10
    with server_process(*overrides(tiny_model, PLUGIN, "engine.max_num_seqs=64", f"engine.num_kv_blocks={blocks}"),
                        cwd=tmp_path) as server:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(64)]
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(lambda p: answer(server.base, p), prompts))
        assert answers == [alone[p] for p in prompts]
        after = wait_idle(server.base)
        assert after[("appliance_num_preemptions_total", ())] > 0
        assert after[("appliance_kv_cache_usage_perc", ())] == 0


def test_overload_is_refused_fast_and_memory_stays_bounded(tiny_model, alone, tmp_path):
    """Four times the queue bound at once: the excess gets 429 with Retry-After at once; the accepted
    ones answer right; the server's resident memory grows by less than 150 MB."""
    bound = 16
    # One sequence at a time, so the queue cannot drain while the burst arrives (a fast CPU serves a
    # short answer in milliseconds); each client connects first and all send at once.
    with server_process(*overrides(tiny_model, PLUGIN, "engine.max_num_seqs=1",
                                   f"server.limits.max_queued_requests={bound}"), cwd=tmp_path) as server:
        answer(server.base, PROMPTS[0])  # warm
        rss_before = session_rss_bytes(server.proc.pid)
        peak = [rss_before]
        go = threading.Barrier(4 * bound)

        def one(prompt):
            with httpx.Client(base_url=server.base, timeout=300) as client:
                client.get("/health")
                go.wait()
                start = time.monotonic()
                response = client.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": prompt}], "max_tokens": 32, "temperature": 0,
                    "ignore_eos": True})
            peak[0] = max(peak[0], session_rss_bytes(server.proc.pid))
            return prompt, response, time.monotonic() - start

        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(4 * bound)]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(one, prompts))
        refused = [(r, t) for _, r, t in results if r.status_code == 429]
        served = [(p, r) for p, r, _ in results if r.status_code == 200]
        assert len(refused) + len(served) == len(prompts), [r.status_code for _, r, _ in results]
        assert len(refused) >= bound and len(served) >= bound, (len(refused), len(served))
        for response, seconds in refused:
            assert response.headers["Retry-After"] == "1" and "max_queued_requests" in error(response)["message"]
            assert seconds < 20  # not queued: the served ones hold the engine far longer, one at a time
        for prompt, response in served:
            assert response.json()["choices"][0]["message"]["content"] == alone[prompt]
        assert peak[0] - rss_before < 150 * 2 ** 20, (rss_before, peak[0])
        assert wait_idle(server.base)[("appliance_kv_cache_usage_perc", ())] == 0


def test_pooling_overload_is_refused_not_queued_without_end(tmp_path):
    """One preparing thread, held by a scene whose URL answers only when the test says so: the next two
    scenes wait (the queue bound), the ones after get 429 at once, since a scene waiting for a thread is
    queued, not running; once the URL answers, the three accepted ones are served; nothing is left."""
    bound = 2
    fetching, release = threading.Event(), threading.Event()

    def hold():
        fetching.set()
        release.wait(60)

    (tmp_path / "scene.tif").write_bytes(SAMPLE_SCENE.read_bytes())
    with RangeServer(tmp_path, before_answer=hold) as source, \
            server_process("pipeline=prithvi_flood", "server.preprocess_workers=1",
                           "server.allowed_media_domains=[127.0.0.1]",
                           f"server.limits.max_queued_requests={bound}", cwd=tmp_path) as server, \
            concurrent.futures.ThreadPoolExecutor(1 + bound) as pool:
        body = {"data": {"data": f"{source.url}/scene.tif", "data_format": "url"}}
        try:
            def post():
                return httpx.post(f"{server.base}/pooling", json=body, timeout=120)
            accepted = [pool.submit(post)]
            assert fetching.wait(30)  # the first scene holds the one thread
            for waiting in range(1, bound + 1):
                accepted.append(pool.submit(post))
                # admitted (and counted) before the next arrives
                wait_for_metric(server.base, "appliance_num_requests_waiting", waiting)
            for _ in range(4):
                refused = httpx.post(f"{server.base}/pooling", json=body, timeout=10)
                assert refused.status_code == 429, refused.text
                assert refused.headers["Retry-After"] == "1" and "max_queued_requests" in error(refused)["message"]
            assert metrics(server.base)[("appliance_num_requests_waiting", ())] == bound
        finally:
            release.set()
        for future in accepted:
            response = future.result()
            assert response.status_code == 200 and response.json()["data"]["data"], response.text
        after = wait_idle(server.base)
        assert after[("appliance_num_requests_running", ())] == 0
        assert after[("appliance_num_requests_waiting", ())] == 0
