/*
 * channel.h - a worker/launcher channel: the FIFO pair <id>.e2w / <id>.w2e
 * in the function's IPC directory (docs/protocol.md, "Channels and FIFOs").
 */
#ifndef STACCATO_CHANNEL_H
#define STACCATO_CHANNEL_H

#include <stdint.h>

#include "wire.h"

typedef struct stc_chan {
    int rfd;      /* <id>.e2w, read end, O_NONBLOCK */
    int wfd;      /* <id>.w2e, write end, blocking */
    long spin_us; /* how long a receive spins on read() before it blocks in poll() */
    uint64_t last_wait_ns; /* how long the last receive waited for its message */
    uint64_t spin_yields;  /* sched_yield passes of receives that spun (for tests) */
} stc_chan;

/* Writes dir/<id>.<suffix> ("e2w" or "w2e") into buf.  Returns 0, or -1
 * with errno ENAMETOOLONG. */
int stc_chan_path(char *buf, size_t cap, const char *dir, uint32_t id, const char *suffix);

/* Opens channel id of ipc_dir.  The engine has already opened both FIFOs, so
 * neither open blocks.  Returns 0, or -1 with errno set. */
int stc_chan_open(stc_chan *c, const char *ipc_dir, uint32_t id, long spin_us);

/* Closes both FIFOs (used by a freshly forked worker on the launcher's
 * channel). */
void stc_chan_close(stc_chan *c);

/* Receives one whole message.  Returns 1, 0 on end of file (the engine is
 * gone), or -1 with errno set. */
int stc_chan_recv(stc_chan *c, uint8_t msg[STC_MSG_LEN]);

/* Stamps send_ts_ns and writes one encoded message with a single write(2),
 * which is atomic because STC_MSG_LEN <= PIPE_BUF.  Returns 0, or -1 with
 * errno set (EPIPE: the engine is gone). */
int stc_chan_send(stc_chan *c, uint8_t msg[STC_MSG_LEN]);

/* CLOCK_MONOTONIC in nanoseconds, CLOCK_REALTIME in microseconds. */
uint64_t stc_mono_ns(void);
uint64_t stc_realtime_us(void);

#endif /* STACCATO_CHANNEL_H */
