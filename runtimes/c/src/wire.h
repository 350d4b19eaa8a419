/*
 * wire.h - worker message codec (docs/protocol.md section 1).
 *
 * Messages are encoded and decoded field by field at explicit little-endian
 * offsets; the in-memory stc_header struct is never written to the wire, so
 * its layout and padding do not matter.
 */
#ifndef STACCATO_WIRE_H
#define STACCATO_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* Usable from C++ too (the C++ runtime's conformance_vectors reuses this
 * codec: C++ functions run in this same C host). */
#ifdef __cplusplus
#define STC_STATIC_ASSERT static_assert
extern "C" {
#else
#define STC_STATIC_ASSERT _Static_assert
#endif

#define STC_MSG_LEN 1024u
#define STC_HEADER_LEN 64u
#define STC_INLINE_MAX 960u
#define STC_NAME_MAX 64u
/* A traced Dispatch starts its inline area with trace id (16), span id (8),
 * flags (1), then the tracestate (up to 512 bytes): name_len bytes. */
#define STC_TRACE_CONTEXT_LEN 25u
#define STC_TRACE_STATE_MAX 512u
#define STC_TRACE_LEN_MAX (STC_TRACE_CONTEXT_LEN + STC_TRACE_STATE_MAX)

#define STC_FLAG_SHM 0x0001u /* PAYLOAD_IN_SHM */
#define STC_FLAG_CPU 0x0002u /* CPU_TIME: Dispatch asks for it, Completion/Failure carry it in aux (µs) */

/* Byte offsets of the header fields. */
#define STC_OFF_KIND 0
#define STC_OFF_FLAGS 2
#define STC_OFF_PAYLOAD_LEN 4
#define STC_OFF_CALL_ID 8
#define STC_OFF_PARENT_CALL_ID 16
#define STC_OFF_WORKER_ID 24
#define STC_OFF_NAME_LEN 28
#define STC_OFF_ERROR_KIND 30
#define STC_OFF_DEADLINE_US 32
#define STC_OFF_SEND_TS_NS 40
#define STC_OFF_AUX 48
#define STC_OFF_RESERVED 52
#define STC_RESERVED_LEN 12

STC_STATIC_ASSERT(STC_OFF_RESERVED + STC_RESERVED_LEN == STC_HEADER_LEN, "header is 64 bytes");
STC_STATIC_ASSERT(STC_HEADER_LEN + STC_INLINE_MAX == STC_MSG_LEN, "message is 1024 bytes");
STC_STATIC_ASSERT(STC_MSG_LEN <= 4096, "a message must fit in PIPE_BUF for atomic writes");

enum stc_kind {
    STC_LAUNCHER_HELLO = 1,
    STC_WORKER_HELLO = 2,
    STC_CREATE_WORKER = 3,
    STC_STOP_WORKER = 4,
    STC_DISPATCH = 5,
    STC_COMPLETION = 6,
    STC_FAILURE = 7,
    STC_INVOKE = 8,
};

/* Highest known error kind code (error kinds are 1..STC_ERROR_KIND_MAX). */
#define STC_ERROR_KIND_MAX 14

/* Decoded header.  Reserved bytes are not represented: they are always 0. */
typedef struct stc_header {
    uint16_t kind;
    uint16_t flags;
    uint32_t payload_len;
    uint64_t call_id;
    uint64_t parent_call_id;
    uint32_t worker_id;
    uint16_t name_len;
    uint16_t error_kind;
    uint64_t deadline_us;
    uint64_t send_ts_ns;
    uint32_t aux;
} stc_header;

/* Result codes of validation, decode and encode (0 = valid). */
typedef enum stc_wire_status {
    STC_WIRE_OK = 0,
    STC_WIRE_ERR_LENGTH,      /* buffer is not exactly 1024 bytes */
    STC_WIRE_ERR_KIND,        /* unknown kind */
    STC_WIRE_ERR_FLAGS,       /* unknown flag bits */
    STC_WIRE_ERR_RESERVED,    /* reserved header bytes not zero */
    STC_WIRE_ERR_PAYLOAD_LEN, /* inline payload longer than 960 bytes */
    STC_WIRE_ERR_NAME_LEN,    /* name_len invalid for the kind */
    STC_WIRE_ERR_ERROR_KIND,  /* error_kind set off Failure, missing or unknown on Failure */
    STC_WIRE_ERR_SHM_KIND,    /* PAYLOAD_IN_SHM on a kind that cannot carry it */
} stc_wire_status;

const char *stc_wire_strerror(stc_wire_status status);

/* Checks every rule of docs/protocol.md that concerns header fields. */
stc_wire_status stc_validate(const stc_header *h);

/* Number of inline-area bytes the message uses: payload_len when the payload
 * is inline, name_len for an Invoke whose input is in shm, else 0.  Only
 * meaningful for a header that passed stc_validate. */
size_t stc_inline_used(const stc_header *h);

/* Decodes and validates msg (len must be STC_MSG_LEN).  On success the
 * inline bytes are at msg + STC_HEADER_LEN. */
stc_wire_status stc_decode(const uint8_t *msg, size_t len, stc_header *out);

/* Validates h, writes the header into msg and zeroes the inline area after
 * the first stc_inline_used(h) bytes; the caller fills those bytes (for an
 * Invoke: the name, then the inline input).  This split lets the caller copy
 * a two-part inline payload straight into the message. */
stc_wire_status stc_encode_header(const stc_header *h, uint8_t msg[STC_MSG_LEN]);

/* stc_encode_header plus a copy of the stc_inline_used(h) inline bytes. */
stc_wire_status stc_encode(const stc_header *h, const void *inline_bytes, uint8_t msg[STC_MSG_LEN]);

/* Overwrites send_ts_ns in an encoded message (set right before writing). */
void stc_set_send_ts(uint8_t msg[STC_MSG_LEN], uint64_t send_ts_ns);

#ifdef __cplusplus
}
#endif

#endif /* STACCATO_WIRE_H */
