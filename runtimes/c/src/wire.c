/* wire.c - worker message codec; see wire.h and docs/protocol.md section 1. */
#include "wire.h"

#include <string.h>

/* Little-endian loads and stores by byte, so the code is independent of the
 * host's byte order and of alignment (compilers turn these into plain moves
 * on little-endian machines). */
static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32; }

static void st16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void st32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void st64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

const char *stc_wire_strerror(stc_wire_status status)
{
    switch (status) {
    case STC_WIRE_OK: return "ok";
    case STC_WIRE_ERR_LENGTH: return "message is not 1024 bytes";
    case STC_WIRE_ERR_KIND: return "unknown message kind";
    case STC_WIRE_ERR_FLAGS: return "unknown flag bits";
    case STC_WIRE_ERR_RESERVED: return "reserved header bytes are not zero";
    case STC_WIRE_ERR_PAYLOAD_LEN: return "inline payload longer than 960 bytes";
    case STC_WIRE_ERR_NAME_LEN: return "invalid name_len";
    case STC_WIRE_ERR_ERROR_KIND: return "invalid error_kind";
    case STC_WIRE_ERR_SHM_KIND: return "PAYLOAD_IN_SHM on a kind without payload";
    }
    return "unknown wire status";
}

/* Kinds that may carry their payload in a shm file. */
static int kind_allows_shm(uint16_t kind)
{
    return kind == STC_DISPATCH || kind == STC_COMPLETION || kind == STC_FAILURE || kind == STC_INVOKE;
}

static stc_wire_status validate_name_len(const stc_header *h, int in_shm)
{
    if (h->kind == STC_DISPATCH) {
        /* A trace context, or nothing. */
        if (h->name_len != 0 && (h->name_len < STC_TRACE_CONTEXT_LEN || h->name_len > STC_TRACE_LEN_MAX))
            return STC_WIRE_ERR_NAME_LEN;
    } else if (h->kind != STC_INVOKE) {
        return h->name_len == 0 ? STC_WIRE_OK : STC_WIRE_ERR_NAME_LEN;
    } else if (h->name_len < 1 || h->name_len > STC_NAME_MAX) {
        return STC_WIRE_ERR_NAME_LEN;
    }
    /* Inline, the name (or context) is part of the payload; in shm it sits
     * alone in the inline area (name_len <= 537 < 960 already holds). */
    if (!in_shm && h->name_len > h->payload_len)
        return STC_WIRE_ERR_NAME_LEN;
    return STC_WIRE_OK;
}

stc_wire_status stc_validate(const stc_header *h)
{
    if (h->kind < STC_LAUNCHER_HELLO || h->kind > STC_INVOKE)
        return STC_WIRE_ERR_KIND;
    if (h->flags & ~(STC_FLAG_SHM | STC_FLAG_CPU))
        return STC_WIRE_ERR_FLAGS;
    if ((h->flags & STC_FLAG_CPU) && h->kind != STC_DISPATCH && h->kind != STC_COMPLETION && h->kind != STC_FAILURE)
        return STC_WIRE_ERR_FLAGS;
    int in_shm = (h->flags & STC_FLAG_SHM) != 0;
    if (in_shm && !kind_allows_shm(h->kind))
        return STC_WIRE_ERR_SHM_KIND;
    if (!in_shm && h->payload_len > STC_INLINE_MAX)
        return STC_WIRE_ERR_PAYLOAD_LEN;
    stc_wire_status st = validate_name_len(h, in_shm);
    if (st != STC_WIRE_OK)
        return st;
    if (h->kind == STC_FAILURE) {
        if (h->error_kind < 1 || h->error_kind > STC_ERROR_KIND_MAX)
            return STC_WIRE_ERR_ERROR_KIND;
    } else if (h->error_kind != 0) {
        return STC_WIRE_ERR_ERROR_KIND;
    }
    return STC_WIRE_OK;
}

size_t stc_inline_used(const stc_header *h)
{
    if (!(h->flags & STC_FLAG_SHM))
        return h->payload_len;
    return h->kind == STC_INVOKE || h->kind == STC_DISPATCH ? h->name_len : 0;
}

stc_wire_status stc_decode(const uint8_t *msg, size_t len, stc_header *out)
{
    if (msg == NULL || len != STC_MSG_LEN)
        return STC_WIRE_ERR_LENGTH;
    for (size_t i = 0; i < STC_RESERVED_LEN; i++)
        if (msg[STC_OFF_RESERVED + i] != 0)
            return STC_WIRE_ERR_RESERVED;
    out->kind = ld16(msg + STC_OFF_KIND);
    out->flags = ld16(msg + STC_OFF_FLAGS);
    out->payload_len = ld32(msg + STC_OFF_PAYLOAD_LEN);
    out->call_id = ld64(msg + STC_OFF_CALL_ID);
    out->parent_call_id = ld64(msg + STC_OFF_PARENT_CALL_ID);
    out->worker_id = ld32(msg + STC_OFF_WORKER_ID);
    out->name_len = ld16(msg + STC_OFF_NAME_LEN);
    out->error_kind = ld16(msg + STC_OFF_ERROR_KIND);
    out->deadline_us = ld64(msg + STC_OFF_DEADLINE_US);
    out->send_ts_ns = ld64(msg + STC_OFF_SEND_TS_NS);
    out->aux = ld32(msg + STC_OFF_AUX);
    return stc_validate(out);
}

stc_wire_status stc_encode_header(const stc_header *h, uint8_t msg[STC_MSG_LEN])
{
    stc_wire_status st = stc_validate(h);
    if (st != STC_WIRE_OK)
        return st;
    st16(msg + STC_OFF_KIND, h->kind);
    st16(msg + STC_OFF_FLAGS, h->flags);
    st32(msg + STC_OFF_PAYLOAD_LEN, h->payload_len);
    st64(msg + STC_OFF_CALL_ID, h->call_id);
    st64(msg + STC_OFF_PARENT_CALL_ID, h->parent_call_id);
    st32(msg + STC_OFF_WORKER_ID, h->worker_id);
    st16(msg + STC_OFF_NAME_LEN, h->name_len);
    st16(msg + STC_OFF_ERROR_KIND, h->error_kind);
    st64(msg + STC_OFF_DEADLINE_US, h->deadline_us);
    st64(msg + STC_OFF_SEND_TS_NS, h->send_ts_ns);
    st32(msg + STC_OFF_AUX, h->aux);
    memset(msg + STC_OFF_RESERVED, 0, STC_RESERVED_LEN);
    size_t used = stc_inline_used(h);
    memset(msg + STC_HEADER_LEN + used, 0, STC_INLINE_MAX - used);
    return STC_WIRE_OK;
}

stc_wire_status stc_encode(const stc_header *h, const void *inline_bytes, uint8_t msg[STC_MSG_LEN])
{
    stc_wire_status st = stc_encode_header(h, msg);
    if (st != STC_WIRE_OK)
        return st;
    size_t used = stc_inline_used(h);
    if (used > 0)
        memcpy(msg + STC_HEADER_LEN, inline_bytes, used);
    return STC_WIRE_OK;
}

void stc_set_send_ts(uint8_t msg[STC_MSG_LEN], uint64_t send_ts_ns) { st64(msg + STC_OFF_SEND_TS_NS, send_ts_ns); }
