#!/usr/bin/env python3
"""A stand-in OpenTelemetry collector for measuring what tracing costs:
takes OTLP/HTTP JSON exports on 127.0.0.1:PORT/v1/traces, counts their
spans, answers 200, keeps nothing. Prints the count when stopped.

    python3 bench/otlp_sink.py [--port 14318]
"""
import argparse
import http.server
import json
import signal
import sys

spans = 0


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global spans
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            spans += sum(len(ss["spans"]) for rs in json.loads(body)["resourceSpans"] for ss in rs["scopeSpans"])
        except (ValueError, KeyError):
            pass
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=14318)
    a = ap.parse_args()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Sink)
    signal.signal(signal.SIGTERM, lambda *_: (print(f"spans received: {spans}", flush=True), sys.exit(0)))
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        print(f"spans received: {spans}", flush=True)


if __name__ == "__main__":
    main()
