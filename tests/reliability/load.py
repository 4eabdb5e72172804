"""Client helpers for the load tests: chat requests by prompt, streamed or not, and the server's state."""
import json

import httpx


ANSWER_TOKENS = 32


def body(prompt: str, stream: bool = False):
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": ANSWER_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def answer(base: str, prompt: str) -> str:
    response = httpx.post(f"{base}/v1/chat/completions", json=body(prompt), timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


async def stream_text(client: httpx.AsyncClient, base: str, prompt: str, cut_after=None):
    """The streamed text, or None when the client hangs up after `cut_after` chunks."""
    text, chunks = [], 0
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body(prompt, stream=True)) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            if cut_after is not None and chunks >= cut_after:
                return None  # leaving the block closes the connection mid-answer
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            text.append(delta or "")
    return "".join(text)


def session_rss_bytes(session_id: int) -> int:
    """Resident memory of every process of a server's session."""
    from tests.server_process import session_processes

    total = 0
    for pid in session_processes(session_id):
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total


def counter(snapshot, name, **labels) -> float:
    return snapshot.get((name, tuple(sorted(labels.items()))), 0.0)
