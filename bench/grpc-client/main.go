// grpc-client: external nop calls over gRPC (grpc-go, unary) and over
// HTTP/1.1 (net/http, keep-alive), call by call in turn, so a shared
// machine's drift hits both alike. Prints p50/p90/p99 per protocol.
//
//	grpc-client CALLS GRPC_ADDR METHOD HTTP_URL
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

// raw sends and receives message bytes as they are: the function's input
// and output are the messages.
type raw struct{}

func (raw) Marshal(v any) ([]byte, error)   { return *v.(*[]byte), nil }
func (raw) Unmarshal(b []byte, v any) error { *v.(*[]byte) = append([]byte(nil), b...); return nil }
func (raw) Name() string                    { return "raw" }

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: grpc-client CALLS GRPC_ADDR METHOD HTTP_URL")
		os.Exit(2)
	}
	calls, err := strconv.Atoi(os.Args[1])
	if err != nil || calls < 1 {
		fmt.Fprintln(os.Stderr, "CALLS must be a positive number")
		os.Exit(2)
	}
	encoding.RegisterCodec(raw{})
	conn, err := grpc.NewClient(os.Args[2], grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(raw{})))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	method, url := "/"+os.Args[3], os.Args[4]
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	in := []byte("hi")
	grpcCall := func() error {
		var out []byte
		return conn.Invoke(context.Background(), method, &in, &out)
	}
	httpCall := func() error {
		r, err := client.Post(url, "application/octet-stream", bytes.NewReader(in))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != 200 {
			return fmt.Errorf("HTTP %d", r.StatusCode)
		}
		return nil
	}
	// Warm both paths (connections, workers).
	for i := 0; i < 200; i++ {
		if err := grpcCall(); err != nil {
			panic(err)
		}
		if err := httpCall(); err != nil {
			panic(err)
		}
	}
	g, h := make([]float64, 0, calls), make([]float64, 0, calls)
	for i := 0; i < calls; i++ {
		t := time.Now()
		if err := grpcCall(); err != nil {
			panic(err)
		}
		g = append(g, float64(time.Since(t).Nanoseconds())/1e3)
		t = time.Now()
		if err := httpCall(); err != nil {
			panic(err)
		}
		h = append(h, float64(time.Since(t).Nanoseconds())/1e3)
	}
	for _, s := range []struct {
		name string
		v    []float64
	}{{"grpc", g}, {"http1.1", h}} {
		sort.Float64s(s.v)
		q := func(p float64) float64 { return s.v[int(p*float64(len(s.v)-1))] }
		fmt.Printf("%-8s calls %d  p50 %.1f us  p90 %.1f us  p99 %.1f us\n", s.name, len(s.v), q(0.5), q(0.9), q(0.99))
	}
}
