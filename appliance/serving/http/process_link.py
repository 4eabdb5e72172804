"""The HTTP process's link to the main process, a plain ASGI middleware (LitServer(middlewares=...), server.py).

- When the app starts, it follows the main process's stop (appliance/serving/stop_signals.py): on its
  SIGTERM, every open request ends with a 503 (a stream gets it as its last event, then `[DONE]`), and
  uvicorn shuts down. After a drain there are none; after a second stop signal these are the cut ones.
- The first request it sees marks the shared state: the main process asks its own address before it says
  ready, and an answer without that mark came from another process.
"""
import asyncio
import signal

from appliance.serving.stop_signals import follow_parent


class ProcessLink:
    def __init__(self, app, frontend, shared):
        self.app = app
        self.frontend = frontend
        self.shared = shared
        self.following = False
        self.answered = False

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan" and not self.following:
            self.following = True
            loop = asyncio.get_running_loop()
            follow_parent(lambda: loop.call_soon_threadsafe(self._stop), "HTTP", lambda: self.shared.stopping)
        elif scope["type"] == "http" and not self.answered:
            self.answered = True
            self.shared.mark_listening()
        await self.app(scope, receive, send)

    def _stop(self) -> None:
        self.frontend.end_all()
        # uvicorn installed its own SIGTERM handler when it started serving (the signal itself stays
        # blocked in this process): calling it is uvicorn's graceful shutdown.
        uvicorn_exit = signal.getsignal(signal.SIGTERM)
        if callable(uvicorn_exit):
            uvicorn_exit(signal.SIGTERM, None)
