"""Hosts Python SocialNetwork services as long-running RPC servers (the
RPC-server variant; cmd/rpcserver does the same for the Go services).

    python3 rpcserver.py --listen 127.0.0.1:9102 --serve sn-text=text:handle --peers peers.json

One asyncio event loop (uvloop when installed) per process, like the
Staccato Python runtime: HTTP/1.1 keep-alive in, a pool of keep-alive
connections per peer out. A service answers POST /function/NAME, errors as
{"error": {"kind", "message"}}; GET /stats counts requests served and calls
made. The handler gets a ctx with the Staccato context's fields and
`await ctx.call(name, data)`, so the same module runs under both.
"""

import argparse
import asyncio
import importlib
import inspect
import json
import logging
import os
import sys
import time

PAYLOAD_MAX = 6 << 20
HEAD_MAX = 64 << 10


class CallError(Exception):
    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class Peer:
    """Keep-alive connections to one server, reused one request at a time."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.idle = []

    async def request(self, path, body, timeout_ms):
        reader = writer = None
        while self.idle:
            reader, writer = self.idle.pop()
            # The server may have closed it while it sat idle (an idle
            # timeout): noticed before anything is sent, so the request
            # goes on a new connection, never twice.
            if not reader.at_eof() and not writer.is_closing():
                break
            writer.close()
            reader = writer = None
        if writer is None:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
                f"x-staccato-timeout-ms: {timeout_ms}\r\n\r\n").encode()
        try:
            writer.write(head + body)
            status, headers = await read_head(reader, response=True)
            n = int(headers.get("content-length", "0"))
            if n > PAYLOAD_MAX:
                raise CallError("output_too_large", f"answer of {n} bytes")
            data = await reader.readexactly(n)
        except BaseException:
            writer.close()
            raise
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append((reader, writer))
        return int(status), data


async def read_head(reader, response=False):
    raw = await reader.readuntil(b"\r\n\r\n")
    if len(raw) > HEAD_MAX:
        raise ValueError("request head too large")
    lines = raw.decode("latin-1").split("\r\n")
    first = lines[0].split(" ", 2)
    if len(first) < 2:
        raise ValueError(f"bad first line {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return (first[1] if response else (first[0], first[1])), headers


class Ctx:
    """What a handler sees: the Staccato context's fields, over HTTP."""

    def __init__(self, server, deadline):
        self._server = server
        self.call_id = 0
        self.parent_call_id = 0
        self.deadline = deadline
        self.logger = logging.getLogger("socialnet")

    def remaining(self):
        return max(0.0, self.deadline - time.time())

    async def call(self, name, data):
        peer = self._server.peers.get(name)
        if peer is None:
            raise CallError("not_found", f"no service named {name}")
        ms = int(self.remaining() * 1000)
        if ms < 1:
            raise CallError("timeout", "the caller's deadline has passed")
        self._server.calls_out += 1
        try:
            status, body = await asyncio.wait_for(
                peer.request(f"/function/{name}", bytes(data), ms), self.remaining())
        except asyncio.TimeoutError:
            raise CallError("timeout", f"{name} did not answer in time") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            raise CallError("engine_unavailable", f"{name}: {e}") from None
        if status == 200:
            return body
        try:
            err = json.loads(body)["error"]
            raise CallError(err["kind"], err.get("message", ""))
        except (ValueError, KeyError, TypeError):
            raise CallError("function_error", f"HTTP {status} from {name}") from None


class Server:
    def __init__(self, handlers, peers, timeout_s):
        self.handlers = handlers
        self.peers = peers
        self.timeout_s = timeout_s
        self.served = self.failed = self.calls_out = 0

    async def connection(self, reader, writer):
        try:
            while True:
                try:
                    (method, path), headers = await read_head(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                n = int(headers.get("content-length", "0"))
                if n > PAYLOAD_MAX:
                    self.respond(writer, 413, error("payload_too_large", "body above the limit"), close=True)
                    return
                body = await reader.readexactly(n)
                status, out = await self.dispatch(method, path, headers, body)
                self.respond(writer, status, out)
                await writer.drain()
        except (ValueError, asyncio.LimitOverrunError) as e:
            self.respond(writer, 400, error("bad_request", str(e)), close=True)
        except ConnectionError:
            pass
        finally:
            writer.close()

    def respond(self, writer, status, body, close=False):
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large",
                  500: "Internal Server Error", 504: "Gateway Timeout"}.get(status, "Error")
        conn = "Connection: close\r\n" if close else ""
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n{conn}\r\n".encode() + body)

    async def dispatch(self, method, path, headers, body):
        if path == "/stats":
            return 200, json.dumps({"served": self.served, "failed": self.failed,
                                    "calls_out": self.calls_out}).encode()
        if path == "/healthz":
            return 200, b""
        name = path[len("/function/"):] if path.startswith("/function/") else None
        handler = self.handlers.get(name)
        if handler is None:
            return 404, error("not_found", f"no function named {name!r}")
        timeout = self.timeout_s
        if "x-staccato-timeout-ms" in headers:
            try:
                timeout = min(timeout, int(headers["x-staccato-timeout-ms"]) / 1000)
            except ValueError:
                return 400, error("bad_request", "x-staccato-timeout-ms must be a whole number")
        self.served += 1
        ctx = Ctx(self, time.time() + timeout)
        try:
            out = handler(ctx, body)
            if inspect.isawaitable(out):
                out = await asyncio.wait_for(out, timeout)
        except asyncio.TimeoutError:
            self.failed += 1
            return 504, error("timeout", f"{name} took longer than {timeout:.3f} s")
        except Exception as e:  # the handler's failure is its caller's answer
            self.failed += 1
            return 500, error("function_error", f"{type(e).__name__}: {e}")
        if isinstance(out, str):
            out = out.encode()
        return 200, bytes(out or b"")


def error(kind, message):
    return json.dumps({"error": {"kind": kind, "message": message}}).encode()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:9102")
    ap.add_argument("--serve", action="append", required=True, metavar="NAME=MODULE:FUNC")
    ap.add_argument("--peers", help="JSON file: service name -> base URL")
    ap.add_argument("--timeout-s", type=float, default=5.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="rpcserver %(message)s")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    handlers = {}
    for spec in args.serve:
        name, _, target = spec.partition("=")
        mod, _, fn = target.partition(":")
        handlers[name] = getattr(importlib.import_module(mod), fn or "handle")
    peers = {}
    if args.peers:
        with open(args.peers) as f:
            for name, url in json.load(f).items():
                hostport = url.split("://", 1)[-1].rstrip("/")
                host, _, port = hostport.rpartition(":")
                peers[name] = Peer(host, int(port))
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    server = Server(handlers, peers, args.timeout_s)
    host, _, port = args.listen.rpartition(":")

    async def serve():
        srv = await asyncio.start_server(server.connection, host, int(port), limit=HEAD_MAX)
        logging.info("serving %s on %s", ",".join(handlers), args.listen)
        async with srv:
            await srv.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
