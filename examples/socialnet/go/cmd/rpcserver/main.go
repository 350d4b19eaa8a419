// Command rpcserver hosts SocialNetwork services as long-running RPC
// servers, DeathStarBench's own architecture: each service is a process
// that takes HTTP/1.1 keep-alive requests and calls the others directly
// over pooled keep-alive connections. It runs the same handlers (package
// sn) that the Staccato functions run; only the Ctx differs.
//
//	rpcserver -listen 127.0.0.1:9101 -serve sn-user,sn-social-graph -peers peers.json
//
// peers.json maps every service name to the base URL of the server that
// hosts it ({"sn-text": "http://127.0.0.1:9102", ...}). A service answers
// POST /function/NAME like the Staccato gateway does (errors as
// {"error": {"kind", "message"}}), so clients and load generators need not
// tell the variants apart. GET /stats counts requests served and calls
// made to other services.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"staccato.local/socialnet/sn"
)

const payloadMax = 6 << 20

type server struct {
	handlers map[string]sn.Handler
	peers    map[string]string
	client   *http.Client
	timeout  time.Duration
	served   atomic.Int64
	failed   atomic.Int64
	callsOut atomic.Int64
}

// CallError is a failed call to another service, with the kind its answer
// gave (the same vocabulary as Staccato's).
type CallError struct {
	Kind    string
	Message string
}

func (e *CallError) Error() string { return e.Kind + ": " + e.Message }

// rpcCtx is the Ctx of one request.
type rpcCtx struct {
	ctx context.Context
	s   *server
}

func (c *rpcCtx) GoContext() context.Context { return c.ctx }

func (c *rpcCtx) Logf(format string, args ...any) { log.Printf(format, args...) }

func (c *rpcCtx) Call(name string, in []byte) ([]byte, error) {
	base, ok := c.s.peers[name]
	if !ok {
		return nil, &CallError{"not_found", "no service named " + name}
	}
	req, err := http.NewRequestWithContext(c.ctx, http.MethodPost, base+"/function/"+name, bytes.NewReader(in))
	if err != nil {
		return nil, &CallError{"bad_request", err.Error()}
	}
	if dl, ok := c.ctx.Deadline(); ok {
		ms := time.Until(dl).Milliseconds()
		if ms < 1 {
			return nil, &CallError{"timeout", "the caller's deadline has passed"}
		}
		req.Header.Set("x-staccato-timeout-ms", strconv.FormatInt(ms, 10))
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	c.s.callsOut.Add(1)
	resp, err := c.s.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, &CallError{"timeout", err.Error()}
		}
		return nil, &CallError{"engine_unavailable", err.Error()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, payloadMax+1))
	if err != nil {
		return nil, &CallError{"engine_unavailable", err.Error()}
	}
	if resp.StatusCode == http.StatusOK {
		return body, nil
	}
	var e struct {
		Error struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error.Kind == "" {
		return nil, &CallError{"function_error", fmt.Sprintf("HTTP %d from %s", resp.StatusCode, name)}
	}
	return nil, &CallError{e.Error.Kind, e.Error.Message}
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/stats":
		writeJSON(w, http.StatusOK, map[string]int64{
			"served": s.served.Load(), "failed": s.failed.Load(), "calls_out": s.callsOut.Load()})
		return
	case r.URL.Path == "/healthz":
		w.WriteHeader(http.StatusOK)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, "/function/")
	h := s.handlers[name]
	if !ok || h == nil {
		writeError(w, http.StatusNotFound, "not_found", "no function named "+strconv.Quote(name))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, payloadMax+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	if len(body) > payloadMax {
		writeError(w, http.StatusRequestEntityTooLarge, "payload_too_large", "body above the limit")
		return
	}
	timeout := s.timeout
	if v := r.Header.Get("x-staccato-timeout-ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 1 {
			writeError(w, http.StatusBadRequest, "bad_request", "x-staccato-timeout-ms must be a whole number >= 1")
			return
		}
		timeout = min(timeout, time.Duration(ms)*time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	s.served.Add(1)
	out, err := h(&rpcCtx{ctx: ctx, s: s}, body)
	if err != nil {
		s.failed.Add(1)
		if ctx.Err() == context.DeadlineExceeded {
			writeError(w, http.StatusGatewayTimeout, "timeout", err.Error())
			return
		}
		writeError(w, http.StatusInternalServerError, "function_error", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	_, _ = w.Write(out)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, status int, kind, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"kind": kind, "message": msg}})
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9100", "address to serve on")
	serve := flag.String("serve", "", "comma-separated services to host (names in package sn)")
	peersFile := flag.String("peers", "", "JSON file mapping every service name to its server's base URL")
	timeout := flag.Duration("timeout", 5*time.Second, "a request's timeout unless its caller's is shorter")
	flag.Parse()
	log.SetPrefix("rpcserver " + *serve + ": ")

	s := &server{handlers: map[string]sn.Handler{}, timeout: *timeout}
	for _, name := range strings.Split(*serve, ",") {
		h, ok := sn.Handlers[name]
		if !ok {
			log.Fatalf("no Go service named %q", name)
		}
		s.handlers[name] = h
	}
	if *peersFile != "" {
		b, err := os.ReadFile(*peersFile)
		if err != nil {
			log.Fatal(err)
		}
		if err := json.Unmarshal(b, &s.peers); err != nil {
			log.Fatalf("%s: %v", *peersFile, err)
		}
	}
	// Keep-alive connections to every peer, as many as there are calls in
	// flight (DeathStarBench's per-service Thrift connection pools).
	s.client = &http.Client{Transport: &http.Transport{
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("serving on %s", ln.Addr())
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 5 * time.Minute}
	log.Fatal(srv.Serve(ln))
}
