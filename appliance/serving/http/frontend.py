"""The HTTP process's side of the server: admission, submission, and one event channel per request.

Routes call `open` (503 while draining or while the engine is dead, 429 when the queue is full), then
`submit` a job to the engine loop and read the request's events with `next_event`. The channel `open`
makes also watches for the client going away and for the request's deadline, and queues either as an
event, so that reading an event is one await on one queue (per streamed token). A job that outlives its
request (a `/v1/scenes` job: its POST is answered at once) gets a channel with no client to watch; its
deadline still applies. `close` ends a request:
an unfinished one is aborted in the engine, which frees its KV blocks (or stops its tiles) within one
step.

The pipes to the engine loop are read and written on the event loop (appliance/serving/pipes.py): the
jobs and aborts of one turn of the loop are written together at its end (what the pipe cannot take
waits in a buffer, so a large body never blocks the loop), and the engine loop's messages (one per
engine-loop turn, every request's events) wake the event loop directly, which routes each event to its
request's channel.
"""
import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Deque, Dict, Optional

from starlette.responses import JSONResponse

from appliance.serving.http.errors import APIError, error_response
from appliance.serving.messages import Abort, Failed
from appliance.serving.pipes import LoopReader, LoopWriter
from appliance.serving.state import DEAD, SharedState

if TYPE_CHECKING:  # imported where the first scrape asks for it
    from appliance.serving.metrics import HttpMetrics

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client closed its connection."""


class Channel:
    """One request's events in order. The client leaving (GONE) and the deadline passing (TIMED_OUT)
    arrive among them. A deque and the one reader's future: the route is the only reader, so
    asyncio.Queue's getter and putter bookkeeping (paid per streamed token) buys nothing."""

    GONE, TIMED_OUT = "client gone", "timed out"

    def __init__(self, uid: str, request, timeout_s: float):
        """`request`: the client's, its body already read (what is left to receive is the disconnect); None
        for a job no connection waits for."""
        self.uid = uid
        self.finished = False
        self._events: Deque[Any] = deque()
        self._reader: Optional[asyncio.Future] = None
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.call_later(timeout_s, self.put, self.TIMED_OUT)
        self._watcher = self._loop.create_task(self._watch(request)) if request is not None else None

    def put(self, event: Any) -> None:
        self._events.append(event)
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    async def get(self) -> Any:
        while not self._events:
            self._reader = self._loop.create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        return self._events.popleft()

    async def _watch(self, request) -> None:
        # It ends by itself: ASGI answers `receive` with http.disconnect once the answer has been sent
        # too. (A cancelled task leaves its CancelledError, traceback and frames as cyclic garbage,
        # which the collector then walked for every request: docs/serving.md.)
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.put(self.GONE)

    def has_events(self) -> bool:
        return bool(self._events)

    def stop_watching(self) -> None:
        """The route is done with the channel (the watcher ends when the answer has been sent)."""
        self._deadline.cancel()


class Frontend:
    def __init__(self, cfg: dict, shared: SharedState, requests, events):
        """`requests`, `events`: this side's ends of the pipes to and from the engine loop."""
        self.cfg = cfg
        self.shared = shared
        self.requests = requests
        self.events = events
        limits = cfg["server"]["limits"]
        self.timeout_s = float(limits["request_timeout_s"])
        self.max_queued = int(limits["max_queued_requests"])
        self.model_name = cfg["server"]["served_model_name"] or cfg["model"]["name"]
        self.channels: Dict[str, Channel] = {}
        self.writer: Optional[LoopWriter] = None  # made on the event loop, by the first request
        self._http_metrics: Optional["HttpMetrics"] = None

    def __getstate__(self):
        """LitServe hands the spec, and so this, to the engine process too, which serves no route: the HTTP
        side's pipe ends stay here (the engine's receiver then sees the end of its pipe when this process
        goes)."""
        return {**self.__dict__, "requests": None, "events": None, "channels": {}, "writer": None,
                "_http_metrics": None}

    def http_metrics(self) -> "HttpMetrics":
        if self._http_metrics is None:
            from appliance.serving.metrics import HttpMetrics

            self._http_metrics = HttpMetrics(self.model_name)
        return self._http_metrics

    # ---- admission ------------------------------------------------------------------------------
    def open(self, uid: str, request) -> Channel:
        """Admit a request whose body was read (`request`: the client's, watched for a disconnect; None: a
        job not tied to a connection, which only its deadline or `close` ends early)."""
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
        self._connect()
        channel = Channel(uid, request, self.timeout_s)
        self.channels[uid] = channel
        self.shared.set_inflight(len(self.channels))
        return channel

    def submit(self, channel: Channel, job: Any) -> None:
        self._sender().send((channel.uid, time.monotonic(), job))

    def close(self, channel: Channel) -> None:
        """The request is answered, failed or abandoned; abort it in the engine unless it finished."""
        if self.channels.pop(channel.uid, None) is None:
            return
        channel.stop_watching()
        self.shared.set_inflight(len(self.channels))
        if not channel.finished:
            self._sender().send((channel.uid, time.monotonic(), Abort()))

    def end_all(self) -> None:
        """The server stops now: every open request ends with a 503 (its route answers it, or ends its
        stream with it)."""
        for channel in list(self.channels.values()):
            channel.put(Failed(503, "the server stopped before this request finished; retry on another replica"))

    async def answer_once(self, request, uid: str, job: Any):
        """Submit a job whose one event is the answer (`Done`) or its failure, and answer the client."""
        request.state.request_id = uid  # for the request log (access_log.py)
        channel = self.open(uid, request)
        try:
            self.submit(channel, job)
            event = await self.next_event(channel)
            if isinstance(event, Failed):
                return error_response(event.status, event.message, event.param)
            return JSONResponse(event.result)
        except ClientGone:
            return JSONResponse({}, status_code=499)  # nobody reads it; the job was dropped
        finally:
            self.close(channel)

    # ---- events ---------------------------------------------------------------------------------
    async def next_event(self, channel: Channel) -> Any:
        """The request's next event; ClientGone if the client left first, APIError 504 past the deadline."""
        event = await channel.get()
        if event is Channel.GONE:
            raise ClientGone()
        if event is Channel.TIMED_OUT:
            raise APIError(504, f"the request took longer than server.limits.request_timeout_s={self.timeout_s:g} s "
                                "and was stopped")
        channel.finished = channel.finished or event.final
        return event

    # ---- the pipes ------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Attach the pipes to the event loop, once, from the event loop (in the HTTP process)."""
        if self.writer is None:
            loop = asyncio.get_running_loop()
            self.writer = LoopWriter(self.requests.fileno(), loop)
            LoopReader(self.events.fileno(), loop, self._route)

    def _sender(self) -> LoopWriter:
        if self.writer is None:
            raise RuntimeError("a request reached the engine's pipe before open() attached it")
        return self.writer

    def _route(self, events) -> None:
        for uid, event in events:
            channel = self.channels.get(uid)
            if channel is not None:
                channel.put(event)
