"""`appliance serve`: the pipeline behind an OpenAI-compatible / vLLM-pooling HTTP API (docs/serving.md).

Three processes, and the folder says where each file runs:

- the main process (`server.py`, `online_stages.py`, `litserve_adapter.py`): checks the pipeline, starts
  LitServe, drains on SIGTERM, exits 1 when the engine dies;
- the HTTP process (`http/`): routes, the middleware, admission, one event channel per request;
- the engine process (`engine_process/`): the LitAPI and its loop, the workers that prepare requests
  and step the one engine;
- between them: `messages.py` (what crosses), `pipes.py` (how), `state.py` (counters in shared memory),
  `metrics.py` (each process writes its own samples, `/metrics` merges them).
"""
