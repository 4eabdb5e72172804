"""The framing between the HTTP process and the engine loop: the event loop's non-blocking ends against
the engine side's blocking ones, with messages larger than a pipe holds."""
import asyncio
import os
import threading

import pytest

from appliance.serving import pipes

BIG = "x" * (3 << 20)  # a base64 image's size: many times a pipe's 64 KiB buffer


def test_the_loop_writer_never_blocks_and_keeps_order_when_the_pipe_is_full():
    rx, tx = os.pipe()
    received = []

    async def main():
        writer = pipes.LoopWriter(tx, asyncio.get_running_loop())
        for i in range(3):
            writer.send((i, BIG))  # returns at once although nothing reads yet
        assert writer.pending  # the pipe took what it could, the rest waits
        reader = threading.Thread(target=lambda: received.extend(pipes.receive(rx) for _ in range(3)))
        reader.start()
        while writer.pending:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(reader.join, 30)

    asyncio.run(main())
    assert [(i, len(text)) for i, text in received] == [(0, len(BIG)), (1, len(BIG)), (2, len(BIG))]
    os.close(rx), os.close(tx)


def test_the_loop_reader_delivers_whole_messages_in_order():
    rx, tx = os.pipe()
    messages = [[("a", 1)], [("b", BIG)], [], [("c", None)]]

    async def main():
        loop = asyncio.get_running_loop()
        got, done = [], asyncio.Event()

        def on_message(message):
            got.append(message)
            if len(got) == len(messages):
                done.set()

        pipes.LoopReader(rx, loop, on_message)
        writer = threading.Thread(target=lambda: [pipes.send(tx, m) for m in messages])
        writer.start()
        await asyncio.wait_for(done.wait(), 30)
        writer.join()
        return got

    assert asyncio.run(main()) == messages
    os.close(rx), os.close(tx)


def test_receive_raises_eof_when_the_other_end_closes_mid_message():
    rx, tx = os.pipe()
    os.write(tx, pipes.HEADER.pack(100) + b"only part")
    os.close(tx)
    with pytest.raises(EOFError):
        pipes.receive(rx)
    os.close(rx)


def test_a_writer_whose_reader_is_gone_drops_messages_quietly():
    rx, tx = os.pipe()
    os.close(rx)

    async def main():
        writer = pipes.LoopWriter(tx, asyncio.get_running_loop())
        writer.send(("uid", 0.0, "job"))  # EPIPE: the engine is gone, the server is going down
        writer.send(("uid", 0.0, "abort"))
        await asyncio.sleep(0)  # the turn ends: the writer flushes
        return writer.closed, bytes(writer.pending)

    assert asyncio.run(main()) == (True, b"")
    os.close(tx)


def test_what_one_turn_of_the_loop_sends_goes_out_in_one_write(monkeypatch):
    rx, tx = os.pipe()
    writes = []
    real_write = pipes.LoopWriter._write
    monkeypatch.setattr(pipes.LoopWriter, "_write",
                        lambda self, data: writes.append(len(data)) or real_write(self, data))

    async def main():
        writer = pipes.LoopWriter(tx, asyncio.get_running_loop())
        for i in range(5):  # five requests handled in the same turn
            writer.send((f"uid{i}", 0.0, "job"))
        assert writes == []  # nothing written while the turn runs
        await asyncio.sleep(0)
        assert len(writes) == 1
        writer.send(("uid5", 0.0, "job"))  # a later turn: a write of its own
        await asyncio.sleep(0)

    asyncio.run(main())
    assert len(writes) == 2
    assert [pipes.receive(rx)[0] for _ in range(6)] == [f"uid{i}" for i in range(6)]
    os.close(rx), os.close(tx)
