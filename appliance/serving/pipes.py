"""Messages over the two pipes between the HTTP process and the engine loop: a frame is an 8-byte
length and a pickle.

The HTTP process reads and writes its ends on its event loop, non-blocking: a turn's events wake the
loop directly, and a job the pipe cannot take at once waits in a buffer until it drains, so no route
ever blocks on the engine. The engine loop's side blocks, each end in its own thread. The
`multiprocessing` Connections made in server.py only carry the descriptors into LitServe's spawned
worker; their own framing is not used.
"""
import asyncio
import os
import pickle
import struct
from typing import Any, Callable

HEADER = struct.Struct("!Q")
READ_SIZE = 1 << 20


def frame(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def send(fd: int, message: Any) -> None:
    """Blocking: the whole frame is written when this returns."""
    view = memoryview(frame(message))
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int) -> Any:
    """Blocking: the next message; EOFError once the other side has closed its end."""
    (size,) = HEADER.unpack(_read_exactly(fd, HEADER.size))
    return pickle.loads(_read_exactly(fd, size))


def _read_exactly(fd: int, size: int) -> bytes:
    data = os.read(fd, size)
    if len(data) == size:
        return data
    buffer = bytearray(data)
    while len(buffer) < size:
        chunk = os.read(fd, min(size - len(buffer), READ_SIZE))
        if not chunk:
            raise EOFError("the pipe was closed")
        buffer += chunk
    return bytes(buffer)


class LoopReader:
    """Calls `on_message` on the event loop for every message that arrives on `fd`."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop, on_message: Callable[[Any], None]):
        self.fd, self.loop, self.on_message = fd, loop, on_message
        self.buffer = bytearray()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the engine's end is closed: the server is going down
            self.loop.remove_reader(self.fd)
            return
        self.buffer += data
        while len(self.buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer)
            end = HEADER.size + size
            if len(self.buffer) < end:
                return
            message = pickle.loads(self.buffer[HEADER.size:end])
            del self.buffer[:end]
            self.on_message(message)


class LoopWriter:
    """Sends messages on `fd` from the event loop without blocking it. What is sent during one turn of
    the loop goes out in one write when the turn's callbacks are done (requests that arrive together
    cost one system call and one wake-up of the engine's receiver); what the pipe cannot take at once
    is kept, in order, and written as the other side reads."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop):
        self.fd, self.loop = fd, loop
        self.pending = bytearray()  # not empty: a flush is due this turn, or the loop waits to write it
        self.closed = False
        os.set_blocking(fd, False)

    def send(self, message: Any) -> None:
        if self.closed:
            return
        data = frame(message)
        if not self.pending:  # what follows this turn joins it
            self.loop.call_soon(self._flush)
        self.pending += data

    def _flush(self) -> None:
        del self.pending[:self._write(self.pending)]
        if self.pending:  # the pipe is full: the rest goes as the other side reads
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        del self.pending[:self._write(self.pending)]
        if not self.pending or self.closed:
            self.loop.remove_writer(self.fd)

    def _write(self, data) -> int:
        try:
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0
        except OSError:  # the engine is gone (the server is going down): nothing will read it
            self.closed = True
            self.pending.clear()
            return len(data)
