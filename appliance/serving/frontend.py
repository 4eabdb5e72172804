"""The HTTP process's side of the server: admission, submission, and one event channel per request.

Routes call `open` (503 while draining or while the engine is dead, 429 when the queue is full), then
`submit` a job to LitServe's request queue and read the request's events with `next_event`, which also
watches for the client going away and for the request's deadline. One dispatcher task reads the engine
loop's messages (one per loop turn, under `mux_uid` in LitServe's response buffer) and routes each event
to its request's channel. `close` ends a request: an unfinished one is aborted in the engine, which frees
its KV blocks (or stops its tiles) within one step.
"""
import asyncio
import collections
import logging
import time
from typing import Any, Dict, Optional

from litserve.utils import ResponseBufferItem

from appliance.serving.errors import APIError
from appliance.serving.messages import Abort
from appliance.serving.state import DEAD, SharedState

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client closed its connection."""


class Channel:
    def __init__(self, uid: str, deadline: float):
        self.uid = uid
        self.deadline = deadline
        self.events: "asyncio.Queue[Any]" = asyncio.Queue()
        self.finished = False


class Frontend:
    def __init__(self, cfg: dict, shared: SharedState, mux_uid: str):
        self.cfg = cfg
        self.shared = shared
        self.mux_uid = mux_uid
        limits = cfg["server"]["limits"]
        self.timeout_s = float(limits["request_timeout_s"])
        self.max_queued = int(limits["max_queued_requests"])
        self.model_name = cfg["server"]["served_model_name"] or cfg["model"]["name"]
        self.request_queue = None     # set by the spec's setup (LitServe's queue to the engine loop)
        self.response_buffer = None
        self.consumer_id = 0
        self.channels: Dict[str, Channel] = {}
        self._dispatcher: Optional[asyncio.Task] = None
        self._http_metrics = None

    def connect(self, request_queue, response_buffer) -> None:
        """Called in the main process before LitServe forks the HTTP process."""
        self.request_queue, self.response_buffer = request_queue, response_buffer
        response_buffer[self.mux_uid] = ResponseBufferItem(event=asyncio.Event(), response_queue=collections.deque())

    def http_metrics(self):
        if self._http_metrics is None:
            from appliance.serving.metrics import HttpMetrics

            self._http_metrics = HttpMetrics(self.model_name)
        return self._http_metrics

    # ---- admission ------------------------------------------------------------------------------
    def open(self, uid: str) -> Channel:
        if self.shared.phase == DEAD:
            raise APIError(503, "the engine has stopped; the server is shutting down, retry on another replica")
        if self.shared.draining:
            raise APIError(503, "the server is shutting down and takes no new requests; retry on another replica",
                           headers={"Retry-After": "1"})
        queued = len(self.channels) - self.shared.running
        if queued >= self.max_queued:
            raise APIError(429, f"the server's queue is full ({queued} requests waiting, "
                                f"server.limits.max_queued_requests={self.max_queued}); retry later",
                           headers={"Retry-After": "1"})
        self._start_dispatcher()
        channel = Channel(uid, time.monotonic() + self.timeout_s)
        self.channels[uid] = channel
        self.shared.set_inflight(len(self.channels))
        return channel

    def submit(self, channel: Channel, job: Any) -> None:
        self.request_queue.put((self.consumer_id, channel.uid, time.monotonic(), job))

    def close(self, channel: Channel) -> None:
        """The request is answered, failed or abandoned; abort it in the engine unless it finished."""
        if self.channels.pop(channel.uid, None) is None:
            return
        self.shared.set_inflight(len(self.channels))
        if not channel.finished:
            try:
                self.request_queue.put((self.consumer_id, channel.uid, time.monotonic(), Abort()))
            except (EOFError, OSError):  # shutting down: the engine goes too
                pass

    # ---- events ---------------------------------------------------------------------------------
    async def next_event(self, channel: Channel, disconnect: "asyncio.Future") -> Any:
        """The request's next event; ClientGone if the client left first, APIError 504 past the deadline."""
        get = asyncio.ensure_future(channel.events.get())
        timeout = max(0.0, channel.deadline - time.monotonic())
        done, _ = await asyncio.wait({get, disconnect}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            event = get.result()
            channel.finished = channel.finished or event.final
            return event
        get.cancel()
        if disconnect in done:
            raise ClientGone()
        raise APIError(504, f"the request took longer than server.limits.request_timeout_s={self.timeout_s:g} s "
                            "and was stopped")

    def _start_dispatcher(self) -> None:
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())

    async def _dispatch(self) -> None:
        item = self.response_buffer[self.mux_uid]
        while True:
            await item.event.wait()
            item.event.clear()
            while item.response_queue:
                events, _status = item.response_queue.popleft()
                for uid, event in events:
                    channel = self.channels.get(uid)
                    if channel is not None:
                        channel.events.put_nowait(event)


async def wait_disconnect(request) -> None:
    """Returns when the client has gone (the body must be read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
