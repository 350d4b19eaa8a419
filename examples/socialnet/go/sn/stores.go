package sn

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Where the stores are. Inside a Staccato container the host's loopback
// services are at $STACCATO_HOST_IP (the engine's --host-ports allow-list
// must name the ports); elsewhere at 127.0.0.1. SN_STORE_HOST overrides
// both, and SN_REDIS_PORT, SN_MEMCACHED_PORT, SN_PG_PORT the ports
// (examples/socialnet/snctl.py starts the stores on these defaults).
func storeAddr(portVar, portDefault string) string {
	host := os.Getenv("SN_STORE_HOST")
	if host == "" {
		host = os.Getenv("STACCATO_HOST_IP")
	}
	if host == "" {
		host = "127.0.0.1"
	}
	port := os.Getenv(portVar)
	if port == "" {
		port = portDefault
	}
	return net.JoinHostPort(host, port)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// Each process opens its stores once, on first use, and shares the pools
// among all its concurrent calls.
var (
	redisOnce sync.Once
	redisC    *redis.Client

	mcOnce sync.Once
	mcC    *memcache.Client

	pgOnce sync.Once
	pgPool *pgxpool.Pool
	pgErr  error
)

func rdb() *redis.Client {
	redisOnce.Do(func() {
		redisC = redis.NewClient(&redis.Options{
			Addr:            storeAddr("SN_REDIS_PORT", "16379"),
			PoolSize:        envInt("SN_REDIS_POOL", 32),
			MinIdleConns:    1,
			DialTimeout:     2 * time.Second,
			ReadTimeout:     3 * time.Second,
			WriteTimeout:    3 * time.Second,
			DisableIdentity: true, // no CLIENT SETINFO round trip per connection
		})
	})
	return redisC
}

func mc() *memcache.Client {
	mcOnce.Do(func() {
		mcC = memcache.New(storeAddr("SN_MEMCACHED_PORT", "21211"))
		mcC.MaxIdleConns = envInt("SN_MEMCACHED_POOL", 32)
		mcC.Timeout = 2 * time.Second
	})
	return mcC
}

func pg(ctx context.Context) (*pgxpool.Pool, error) {
	pgOnce.Do(func() {
		url := fmt.Sprintf("postgres://%s@%s/%s?pool_max_conns=%d&pool_min_conns=1",
			envOr("SN_PG_USER", "socialnet"), storeAddr("SN_PG_PORT", "15432"), envOr("SN_PG_DB", "socialnet"),
			envInt("SN_PG_POOL", 8))
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			pgErr = err
			return
		}
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		pgPool, pgErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if pgErr != nil {
		return nil, fmt.Errorf("postgres: %w", pgErr)
	}
	return pgPool, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// strictUnmarshal decodes one JSON value, refusing unknown fields and
// trailing data.
func strictUnmarshal(in []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(in))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}
