"""frontend.Channel: one request's events, in order, to its one reader."""
import asyncio

from appliance.serving.http.frontend import Channel


class Client:
    """A request whose client leaves when `leave` is set."""

    def __init__(self):
        self.leave = asyncio.Event()

    async def receive(self):
        await self.leave.wait()
        return {"type": "http.disconnect"}


def test_events_come_in_order_and_wake_a_waiting_reader():
    async def main():
        channel = Channel("r1", Client(), timeout_s=60)
        channel.put("a")
        channel.put("b")
        assert channel.has_events()
        assert [await channel.get(), await channel.get()] == ["a", "b"]
        assert not channel.has_events()
        reader = asyncio.create_task(channel.get())
        await asyncio.sleep(0)  # the reader now waits
        assert not reader.done()
        channel.put("c")
        assert await asyncio.wait_for(reader, 1) == "c"
        channel.stop_watching()

    asyncio.run(main())


def test_the_client_leaving_and_the_deadline_arrive_as_events():
    async def main():
        client = Client()
        channel = Channel("r2", client, timeout_s=60)
        channel.put("tokens")
        client.leave.set()
        assert await channel.get() == "tokens"
        assert await asyncio.wait_for(channel.get(), 1) == Channel.GONE
        channel.stop_watching()

        late = Channel("r3", Client(), timeout_s=0.01)
        assert await asyncio.wait_for(late.get(), 1) == Channel.TIMED_OUT

    asyncio.run(main())


def test_a_cancelled_reader_leaves_the_channel_usable():
    async def main():
        channel = Channel("r4", Client(), timeout_s=60)
        reader = asyncio.create_task(channel.get())
        await asyncio.sleep(0)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        channel.put("after")
        assert await asyncio.wait_for(channel.get(), 1) == "after"
        channel.stop_watching()

    asyncio.run(main())


def test_a_channel_without_a_client_has_no_watcher_but_keeps_its_deadline():
    """A scene job's channel (/v1/scenes): no connection to watch, only the deadline ends it early."""
    async def main():
        detached = Channel("r5", None, timeout_s=0.01)
        assert all(task is asyncio.current_task() for task in asyncio.all_tasks())  # nothing watches
        detached.put("progress")
        assert await detached.get() == "progress"
        assert await asyncio.wait_for(detached.get(), 1) == Channel.TIMED_OUT

    asyncio.run(main())
