package staccato

import (
	"time"
	_ "unsafe" // go:linkname
)

// nanotime is the Go runtime's CLOCK_MONOTONIC reading (through the vDSO on
// Linux), the clock docs/protocol.md asks for in send_ts_ns. The runtime
// keeps this linkname available on purpose (see the comment on nanotime in
// runtime/time_nofake.go).
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// nowUs is CLOCK_REALTIME in microseconds since the Unix epoch, the clock of
// deadline_us.
func nowUs() uint64 { return uint64(time.Now().UnixMicro()) }
