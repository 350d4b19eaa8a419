"""In-process channel tests: framing and back-pressure corner cases that a
live engine cannot force reliably (partial reads, a full w2e pipe)."""
import asyncio
import os
import time

import pytest

from staccato import CallError, wire
from staccato.errors import ErrorKind
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
        if wire.FAST is not None:
            assert h.channel._reader.backlogged  # the C writes queue behind it
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
    if wire.FAST is not None:
        assert not h.channel._reader.backlogged


def test_close_fails_pending_calls(harness):
    seen = []

    late = []

    async def caller(ctx, data):
        try:
            await ctx.call("slow")
        except CallError as e:
            seen.append(e.kind)
        # A call made on the closed channel (in C, from a Context the
        # reader built) fails the same way.
        call = ctx.call("after")
        try:
            await call
        except CallError as e:
            # A _fast.Call that failed is not a cancelled one.
            late.append((e.kind, getattr(call, "cancelled", lambda: False)()))

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
    assert late == [("engine_unavailable", False)]
    assert 1 not in h.runtime.workers


async def recv_n(h, n):
    return [await h.recv() for _ in range(n)]


def dispatch(i, data=b""):
    return pack(wire.DISPATCH, 0, len(data), GATEWAY | i, 0, 1, 0, 0, 0, 0, 0, data)


def test_an_async_handler_that_raises_when_called_fails_its_call_only(harness):
    async def one_argument(ctx):  # the engine calls it with two: TypeError
        return b""

    h = harness(one_argument)
    os.write(h.e2w_w, dispatch(1) + dispatch(2))
    outs = h.run(recv_n(h, 2))
    for i, m in enumerate(outs, 1):
        assert (m.kind, m.call_id, m.error_kind) == (wire.FAILURE, GATEWAY | i, int(ErrorKind.function_error))
        assert m.inline.startswith(b"TypeError"), m.inline


def test_a_str_result_that_is_not_utf8_fails_its_call(harness):
    def lone_surrogate(ctx, data):
        return "\ud800" if data == b"bad" else "fine"

    h = harness(lone_surrogate)
    os.write(h.e2w_w, dispatch(1, b"bad") + dispatch(2, b"ok"))
    bad, ok = h.run(recv_n(h, 2))
    assert (bad.kind, bad.error_kind) == (wire.FAILURE, int(ErrorKind.function_error))
    assert b"not valid UTF-8" in bad.inline, bad.inline
    assert (ok.kind, ok.inline) == (wire.COMPLETION, b"fine")


def test_a_plain_handler_raising_a_base_exception_fails_its_call_and_the_next_is_served(harness):
    def cancels(ctx, data):
        if data == b"cancel":
            raise asyncio.CancelledError()
        return data

    h = harness(cancels)
    # Both in one read: the second must not wait for another event.
    os.write(h.e2w_w, dispatch(1, b"cancel") + dispatch(2, b"after"))
    first, second = h.run(recv_n(h, 2))
    assert (first.kind, first.error_kind, first.inline) == (wire.FAILURE, int(ErrorKind.function_error), b"CancelledError")
    assert (second.kind, second.call_id, second.inline) == (wire.COMPLETION, GATEWAY | 2, b"after")


def test_a_call_given_up_on_leaves_the_table_and_its_late_reply_is_dropped(harness):
    async def impatient(ctx, data):
        if data == b"quick":
            return b"quick"
        try:
            await asyncio.wait_for(ctx.call("slow"), 0.05)
        except asyncio.TimeoutError:
            pass
        return b"%d" % len(ctx._channel._pending)

    h = harness(impatient)

    async def scenario():
        os.write(h.e2w_w, dispatch(1))
        inv = await h.recv()
        assert inv.kind == wire.INVOKE
        done = await h.recv()
        # The reply after the caller gave up: nobody waits, nothing breaks.
        os.write(h.e2w_w, pack(wire.COMPLETION, 0, 4, inv.call_id, 0, 1, 0, 0, 0, 0, 0, b"late"))
        os.write(h.e2w_w, dispatch(2, b"quick"))
        return done, await h.recv()

    done, again = h.run(scenario())
    assert (done.kind, done.inline) == (wire.COMPLETION, b"0")
    assert (again.kind, again.call_id, again.inline) == (wire.COMPLETION, GATEWAY | 2, b"quick")


def test_the_cpu_time_asked_for_comes_back_with_the_reply(harness):
    def spins(ctx, data):
        t = time.thread_time()
        while time.thread_time() - t < 0.002:
            pass
        return b"x"

    h = harness(spins)
    os.write(h.e2w_w, pack(wire.DISPATCH, wire.CPU_TIME, 0, GATEWAY | 1, 0, 1, 0, 0, 0, 0, 0, b""))
    m = h.run(h.recv())
    assert (m.kind, m.inline) == (wire.COMPLETION, b"x")
    assert m.flags & wire.CPU_TIME and 2000 <= m.aux < 1_000_000, (m.flags, m.aux)


def test_random_messages_never_break_the_reader(harness, tmp_path):
    # The engine's messages are checked before use: thousands of random
    # headers (around every boundary the checks have) and payloads, some
    # valid, then a valid Dispatch that must still be answered.
    import random
    import struct
    rng = random.Random(99)
    replies = []

    def echo(ctx, data):
        return data

    h = harness(echo)

    async def scenario():
        for batch in range(100):
            raw = b""
            for _ in range(20):
                # Every kind but StopWorker, which rightly closes the channel.
                kind = rng.choice((0, 1, 2, 3, 5, 6, 7, 8, 9, 5, 6, 7))
                flags = rng.choice((0, 0, 2, rng.randrange(0, 4)))
                name_len = rng.choice((0, 0, 25, rng.randrange(0, 1000)))
                payload_len = rng.choice((0, name_len, rng.randrange(0, 961), rng.randrange(0, 1 << 32)))
                error_kind = rng.choice((0, 0, rng.randrange(0, 20)))
                # Ids no call of this test uses: replies to them are dropped.
                call_id = rng.choice((GATEWAY | rng.randrange(1 << 20, 1 << 30), rng.getrandbits(64)))
                raw += struct.pack("<HHIQQIHHQQI12s", kind, flags, payload_len, call_id, 0, 1, name_len,
                                   error_kind, 0, 0, 0, bytes(12)) + rng.randbytes(960)
            os.write(h.e2w_w, raw)  # 20 KiB: the pipe has room once the last batch was read
            await asyncio.sleep(0.002)
            # Drain what the valid Dispatches among them were answered.
            while True:
                try:
                    replies.append(os.read(h.w2e_r, 1 << 16))
                except BlockingIOError:
                    break
        os.write(h.e2w_w, dispatch(7, b"still here"))
        for _ in range(1000):
            m = await h.recv()
            if m.call_id == GATEWAY | 7:
                return m
        raise AssertionError("the last Dispatch was not answered")

    m = h.run(scenario(), timeout=60)
    assert (m.kind, m.inline) == (wire.COMPLETION, b"still here")
    assert not h.channel.closed
    assert replies, "no random Dispatch was valid: the test lost its power"


def completion(call_id, data=b""):
    return pack(wire.COMPLETION, 0, len(data), call_id, 0, 1, 0, 0, 0, 0, 0, data)


def test_ctx_call_is_a_coroutine_and_sends_nothing_until_awaited(harness):
    async def lazy(ctx, data):
        unawaited = ctx.call("f", b"never")
        assert asyncio.iscoroutine(unawaited)
        if wire.FAST is not None:
            # The call made in C (the reader built this Context).
            assert type(unawaited) is wire.FAST.Call
        unawaited.close()
        import gc
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dropped = ctx.call("f", b"dropped")
            del dropped
            gc.collect()
        assert any(issubclass(w.category, RuntimeWarning) and "never awaited" in str(w.message)
                   for w in caught), caught
        return b"%d" % len(ctx._channel._pending)

    h = harness(lazy)
    os.write(h.e2w_w, dispatch(1))
    m = h.run(h.recv())
    # The next message is the Completion: no Invoke went out.
    assert (m.kind, m.call_id, m.inline) == (wire.COMPLETION, GATEWAY | 1, b"0")


def test_calls_made_every_way_share_one_id_sequence_and_each_reply_reaches_its_caller(harness):
    big = b"b" * 2000  # goes through shm: the channel's Python code sends it

    async def many(ctx, data):
        task = asyncio.create_task(ctx.call("t", b"task"))
        outs = [await ctx.call("a"), await ctx.call("b", "text"), await ctx.call("c", big),
                await ctx.call("d", bytearray(b"ba"))]
        outs += await asyncio.gather(ctx.call("e", b"1"), ctx.call("e", b"2"))
        outs.append(await task)
        return b",".join(outs)

    h = harness(many)

    async def scenario():
        os.write(h.e2w_w, dispatch(1))
        seen = []
        while True:
            m = await h.recv()
            if m.kind != wire.INVOKE:
                return seen, m
            name = m.inline[:m.name_len]
            if m.flags & wire.PAYLOAD_IN_SHM:
                path = h.runtime.shm_dir + "/" + wire.shm_file_name(m.call_id, wire.INVOKE)
                with open(path, "rb") as f:
                    payload = f.read()
                os.unlink(path)
            else:
                payload = m.inline[m.name_len:]
            seen.append((m.call_id, name, payload))
            if name == b"t":
                continue  # answered last, after every other
            os.write(h.e2w_w, completion(m.call_id, name + b"=" + payload[:4]))
            if name == b"e" and sum(s[1] == b"e" for s in seen) == 2:
                task_id = next(s[0] for s in seen if s[1] == b"t")
                os.write(h.e2w_w, completion(task_id, b"t=task"))

    seen, done = h.run(scenario())
    ids = [s[0] for s in seen]
    assert [i >> 32 for i in ids] == [1] * 7
    assert sorted(i & 0xFFFFFFFF for i in ids) == list(range(1, 8))  # one counter, no id twice
    # The task's call goes out when the task first runs: before or after "a".
    assert [s[1] for s in seen if s[1] != b"t"] == [b"a", b"b", b"c", b"d", b"e", b"e"]
    payloads = {name: payload for _, name, payload in seen}
    assert payloads[b"b"] == b"text" and payloads[b"c"] == big and payloads[b"t"] == b"task"
    assert (done.kind, done.inline) == (wire.COMPLETION, b"a=,b=text,c=bbbb,d=ba,e=1,e=2,t=task")
    assert not h.channel._pending


def test_a_task_running_only_a_call_can_be_cancelled_and_its_reply_is_dropped(harness):
    async def cancels(ctx, data):
        if data == b"quick":
            return b"%d" % len(ctx._channel._pending)
        task = asyncio.create_task(ctx.call("slow"))
        await asyncio.sleep(0.01)  # the Invoke is out
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return b"cancelled, %d pending" % len(ctx._channel._pending)
        return b"not cancelled"

    h = harness(cancels)

    async def scenario():
        os.write(h.e2w_w, dispatch(1))
        inv = await h.recv()
        assert inv.kind == wire.INVOKE
        done = await h.recv()
        os.write(h.e2w_w, completion(inv.call_id, b"late") + dispatch(2, b"quick"))
        return done, await h.recv()

    done, again = h.run(scenario())
    assert (done.kind, done.inline) == (wire.COMPLETION, b"cancelled, 0 pending")
    assert (again.kind, again.call_id, again.inline) == (wire.COMPLETION, GATEWAY | 2, b"0")


def test_a_caller_sees_its_context_variables_after_a_call(harness):
    import contextvars
    var = contextvars.ContextVar("var", default=b"unset")

    async def keeps(ctx, data):
        var.set(data)
        await ctx.call("f")
        return var.get()

    h = harness(keeps)

    async def scenario():
        os.write(h.e2w_w, dispatch(1, b"one") + dispatch(2, b"two"))
        invs = [await h.recv(), await h.recv()]
        # Both replies, and a third Dispatch, in one read.
        os.write(h.e2w_w, completion(invs[1].call_id) + completion(invs[0].call_id) + dispatch(3, b"three"))
        got = [await h.recv() for _ in range(3)]
        inv3, = [m for m in got if m.kind == wire.INVOKE]
        outs = [m for m in got if m.kind != wire.INVOKE]
        os.write(h.e2w_w, completion(inv3.call_id))
        return outs + [await h.recv()]

    outs = h.run(scenario())
    assert sorted((m.call_id, m.inline) for m in outs) == [(GATEWAY | 1, b"one"), (GATEWAY | 2, b"two"),
                                                          (GATEWAY | 3, b"three")]
    assert var.get() == b"unset"


@pytest.mark.skipif(wire.FAST is None, reason="the C reader only")
def test_a_reply_read_from_inside_a_task_wakes_its_caller_through_the_loop(harness):
    # The reader runs a caller's wake-up at once only outside any task (a
    # task's step cannot start inside another's); called from a task, it
    # queues the wake-up instead.
    async def caller(ctx, data):
        return b"got " + await ctx.call("f")

    h = harness(caller)

    async def scenario():
        os.write(h.e2w_w, dispatch(1))
        inv = await h.recv()
        h.loop.remove_reader(h.e2w_r)
        os.write(h.e2w_w, completion(inv.call_id, b"it"))
        h.channel._reader()  # inside this test's task
        return await h.recv()

    m = h.run(scenario())
    assert (m.kind, m.inline) == (wire.COMPLETION, b"got it")


def test_thousands_of_calls_leave_no_object_behind(harness):
    import gc
    import tracemalloc

    async def caller(ctx, data):
        for _ in range(int(data)):
            await ctx.call("f", b"x")
        return b"done"

    h = harness(caller)

    async def engine(rounds, call_id):
        os.write(h.e2w_w, dispatch(call_id, b"%d" % rounds))
        while True:
            m = await h.recv()
            if m.kind != wire.INVOKE:
                return m
            os.write(h.e2w_w, completion(m.call_id, b"reply"))

    from staccato.context import Context
    kinds = (Context, wire.FAST.Call) if wire.FAST is not None else (Context,)

    def live_calls():
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) in kinds)

    assert h.run(engine(500, 1)).inline == b"done"  # warm: caches, free lists
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert h.run(engine(5000, 2)).inline == b"done"
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert live_calls() == 0
    assert not h.channel._pending
    # A leaked int key, bytes or Call per call would be >= 150 kB here.
    assert grown < 40_000, grown


def test_nothing_after_a_stop_worker_read_with_it_is_run(harness):
    ran = []

    def echo(ctx, data):
        ran.append(data)
        return data

    h = harness(echo)
    stop = pack(wire.STOP_WORKER, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, b"")
    os.write(h.e2w_w, dispatch(1, b"before") + stop + dispatch(2, b"after"))

    async def scenario():
        first = await h.recv()
        for _ in range(20):
            await asyncio.sleep(0.002)
        return first

    first = h.run(scenario())
    assert (first.call_id, first.inline) == (GATEWAY | 1, b"before")
    assert h.channel.closed
    assert ran == [b"before"]  # the channel closed: the reader stopped there
    try:
        rest = os.read(h.w2e_r, wire.MESSAGE_LEN)
    except BlockingIOError:
        rest = b""
    assert rest == b"", rest


@pytest.mark.skipif(wire.FAST is None, reason="the C reader only")
def test_a_reply_wakes_its_caller_before_the_reader_returns(harness):
    # Outside any task (as the loop calls it), the reader runs the caller's
    # wake-up itself: the caller's Completion is written by the time it
    # returns, not in a later trip through the loop.
    async def caller(ctx, data):
        return b"got " + await ctx.call("f")

    h = harness(caller)
    seen = []

    def read_now():
        h.channel._reader()
        try:
            seen.append(os.read(h.w2e_r, wire.MESSAGE_LEN))
        except BlockingIOError:
            seen.append(None)

    async def scenario():
        os.write(h.e2w_w, dispatch(1))
        inv = await h.recv()
        h.loop.remove_reader(h.e2w_r)
        os.write(h.e2w_w, completion(inv.call_id, b"it"))
        h.loop.call_soon(read_now)
        while not seen:
            await asyncio.sleep(0.001)
        return seen[0]

    raw = h.run(scenario())
    assert raw is not None, "the caller was not woken while the reader ran"
    m = wire.decode(raw)
    assert (m.kind, m.inline) == (wire.COMPLETION, b"got it")
