"""In-process channel tests: framing and back-pressure corner cases that a
live engine cannot force reliably (partial reads, a full w2e pipe)."""
import asyncio
import os

import pytest

from staccato import CallError, wire
from staccato.channel import WorkerChannel
from staccato.launcher import Runtime
from staccato.wire import pack

GATEWAY = 1 << 63


class Harness:
    """A WorkerChannel on two os.pipe()s, with the test as the engine."""

    def __init__(self, tmp_path, handler):
        self.loop = asyncio.new_event_loop()
        (tmp_path / "shm").mkdir()
        self.runtime = Runtime(self.loop, "fn", str(tmp_path), handler, 6 << 20)
        self.e2w_r, self.e2w_w = os.pipe()
        self.w2e_r, self.w2e_w = os.pipe()
        for fd in (self.e2w_r, self.w2e_w, self.w2e_r):
            os.set_blocking(fd, False)
        self.channel = WorkerChannel(self.runtime, 1, self.e2w_r, self.w2e_w)
        self.runtime.workers[1] = self.channel
        self.channel.start()

    def run(self, coro, timeout=10):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    async def recv(self):
        """Next message from w2e (polling; the test owns the loop)."""
        buf = b""
        while len(buf) < wire.MESSAGE_LEN:
            try:
                chunk = os.read(self.w2e_r, wire.MESSAGE_LEN - len(buf))
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            assert chunk, "EOF on w2e"
            buf += chunk
        return wire.decode(buf)

    def close(self):
        self.channel.close()
        for fd in (self.e2w_w, self.w2e_r):
            os.close(fd)
        self.loop.close()


@pytest.fixture
def harness(tmp_path):
    made = []

    def make(handler):
        made.append(Harness(tmp_path, handler))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_partial_and_coalesced_reads(harness):
    async def echo(ctx, data):
        return data

    h = harness(echo)
    raw = b"".join(pack(wire.DISPATCH, 0, 1, GATEWAY | i, 0, 1, 0, 0, 0, 0, 0, b"%d" % i)
                   for i in range(3))

    async def scenario():
        # Half a message, then the rest of it together with two more.
        os.write(h.e2w_w, raw[:500])
        await asyncio.sleep(0.01)
        os.write(h.e2w_w, raw[500:])
        return [await h.recv() for _ in range(3)]

    outs = h.run(scenario())
    assert sorted((m.call_id, m.inline) for m in outs) == [(GATEWAY | i, b"%d" % i) for i in range(3)]


def test_invalid_message_is_skipped_without_losing_framing(harness):
    async def echo(ctx, data):
        return data

    h = harness(echo)
    bad = bytearray(pack(wire.DISPATCH, 0, 1, GATEWAY | 1, 0, 1, 0, 0, 0, 0, 0, b"x"))
    bad[60] = 1  # reserved byte
    good = pack(wire.DISPATCH, 0, 1, GATEWAY | 2, 0, 1, 0, 0, 0, 0, 0, b"y")
    os.write(h.e2w_w, bytes(bad) + good)
    msg = h.run(h.recv())
    assert (msg.call_id, msg.inline) == (GATEWAY | 2, b"y")


def test_full_w2e_pipe_queues_messages_in_order(harness):
    n = 300  # far more than a 64 KiB pipe holds (64 messages)

    async def fanout(ctx, data):
        outs = await asyncio.gather(*(ctx.call("f", b"%d" % i) for i in range(n)))
        return b"%d" % len(outs)

    h = harness(fanout)

    async def scenario():
        os.write(h.e2w_w, pack(wire.DISPATCH, 0, 0, GATEWAY | 1, 0, 1, 0, 0, 0, 0, 0, b""))
        # Let the handler fill the pipe before the engine starts reading.
        for _ in range(20):
            await asyncio.sleep(0.005)
        assert h.channel._backlog, "expected messages waiting for w2e"
        seqs = []
        for _ in range(n):
            inv = await h.recv()
            assert inv.kind == wire.INVOKE
            seqs.append(inv.call_id & 0xFFFFFFFF)
            os.write(h.e2w_w, pack(wire.COMPLETION, 0, 0, inv.call_id, 0, 1, 0, 0, 0, 0, 0, b""))
        return seqs, await h.recv()

    seqs, done = h.run(scenario())
    assert seqs == list(range(1, n + 1))  # nothing lost or reordered
    assert done.kind == wire.COMPLETION and done.inline == b"%d" % n
    assert h.channel._backlog is None


def test_close_fails_pending_calls(harness):
    seen = []

    async def caller(ctx, data):
        try:
            await ctx.call("slow")
        except CallError as e:
            seen.append(e.kind)

    h = harness(caller)

    async def scenario():
        os.write(h.e2w_w, pack(wire.DISPATCH, 0, 0, GATEWAY | 1, 0, 1, 0, 0, 0, 0, 0, b""))
        assert (await h.recv()).kind == wire.INVOKE
        h.channel.close("test")
        for _ in range(10):
            await asyncio.sleep(0)
        # A closed channel refuses new calls at once.
        from staccato.context import Context
        with pytest.raises(CallError) as err:
            await Context(h.channel, 5, 0, 0).call("x")
        return err.value.kind

    assert h.run(scenario()) == "engine_unavailable"
    assert seen == ["engine_unavailable"]
    assert 1 not in h.runtime.workers
