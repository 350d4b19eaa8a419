package sn

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"
)

// UniqueID (sn-unique-id) makes post ids: 41 bits of milliseconds since
// 2020, 10 bits of a node number drawn at random when the process starts,
// 12 bits of a counter within the millisecond (DeathStarBench's
// Snowflake-like layout). Two processes collide only if they drew the same
// node number and make an id in the same millisecond with the same count;
// a collision is refused by post storage's primary key, never lost.
func UniqueID(ctx Ctx, in []byte) ([]byte, error) {
	var req struct {
		Op       string `json:"op"`
		PostType string `json:"post_type"`
	}
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	if req.Op != "compose_unique_id" {
		return nil, badInput("sn-unique-id: unknown op %q", req.Op)
	}
	return reply(map[string]int64{"post_id": ids.next()})
}

const idEpochMs = 1577836800000 // 2020-01-01

type idGen struct {
	mu     sync.Mutex
	node   int64
	lastMs int64
	seq    int64
}

var ids = func() *idGen {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return &idGen{node: int64(binary.LittleEndian.Uint16(b[:]) & 0x3ff)}
}()

func (g *idGen) next() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		ms := time.Now().UnixMilli() - idEpochMs
		if ms < g.lastMs {
			ms = g.lastMs // the clock stepped back: keep counting in the last millisecond
		}
		if ms != g.lastMs {
			g.lastMs, g.seq = ms, 0
		}
		if g.seq < 1<<12 {
			id := ms<<22 | g.node<<12 | g.seq
			g.seq++
			return id
		}
		// 4096 ids in this millisecond already: wait for the next.
		time.Sleep(100 * time.Microsecond)
		g.lastMs++
		g.seq = 0
	}
}
