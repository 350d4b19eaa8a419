/*
 * test_wire.c - checks the C codec against testvectors/message_v1.json:
 * valid vectors decode to exactly their fields and re-encode byte for byte,
 * invalid vectors are rejected.  Plus a few codec properties the vectors do
 * not cover.  Usage: test_wire <message_v1.json>.  Last line: "N passed, N failed".
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vector_util.h"
#include "wire.h"

static int passed, failed;

/* Records one test case; reason == NULL means it passed. */
static void record(int tc_id, const char *comment, const char *reason)
{
    if (reason == NULL) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL tcId %d (%s): %s\n", tc_id, comment, reason);
}


/* Field readers: small ints are JSON numbers, u64 are decimal strings. */
static int get_uint(const cJSON *fields, const char *name, uint64_t max, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(fields, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > (double)max)
        return -1;
    *out = (uint64_t)v->valuedouble;
    return (double)*out == v->valuedouble ? 0 : -1;
}

static int get_u64(const cJSON *fields, const char *name, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(fields, name);
    if (!cJSON_IsString(v) || v->valuestring[0] == '\0' || v->valuestring[0] == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v->valuestring, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = n;
    return 0;
}

/* Builds the expected header from the vector's "fields".  Returns NULL or a
 * reason. */
static const char *parse_fields(const cJSON *fields, stc_header *h)
{
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(fields, "kind");
    int code = cJSON_IsString(kind) ? kind_code(kind->valuestring) : -1;
    if (code < 0)
        return "bad kind in vector";
    uint64_t flags, payload_len, worker_id, name_len, error_kind, aux;
    if (get_uint(fields, "flags", UINT16_MAX, &flags) || get_uint(fields, "payload_len", UINT32_MAX, &payload_len) ||
        get_uint(fields, "worker_id", UINT32_MAX, &worker_id) || get_uint(fields, "name_len", UINT16_MAX, &name_len) ||
        get_uint(fields, "error_kind", UINT16_MAX, &error_kind) || get_uint(fields, "aux", UINT32_MAX, &aux))
        return "bad small field in vector";
    if (get_u64(fields, "call_id", &h->call_id) || get_u64(fields, "parent_call_id", &h->parent_call_id) ||
        get_u64(fields, "deadline_us", &h->deadline_us) || get_u64(fields, "send_ts_ns", &h->send_ts_ns))
        return "bad u64 field in vector";
    h->kind = (uint16_t)code;
    h->flags = (uint16_t)flags;
    h->payload_len = (uint32_t)payload_len;
    h->worker_id = (uint32_t)worker_id;
    h->name_len = (uint16_t)name_len;
    h->error_kind = (uint16_t)error_kind;
    h->aux = (uint32_t)aux;
    return NULL;
}

static const char *compare_headers(const stc_header *got, const stc_header *want)
{
    if (got->kind != want->kind) return "kind differs";
    if (got->flags != want->flags) return "flags differ";
    if (got->payload_len != want->payload_len) return "payload_len differs";
    if (got->call_id != want->call_id) return "call_id differs";
    if (got->parent_call_id != want->parent_call_id) return "parent_call_id differs";
    if (got->worker_id != want->worker_id) return "worker_id differs";
    if (got->name_len != want->name_len) return "name_len differs";
    if (got->error_kind != want->error_kind) return "error_kind differs";
    if (got->deadline_us != want->deadline_us) return "deadline_us differs";
    if (got->send_ts_ns != want->send_ts_ns) return "send_ts_ns differs";
    if (got->aux != want->aux) return "aux differs";
    return NULL;
}

static const char *check_valid(const cJSON *tc, const uint8_t *msg, size_t len)
{
    stc_header want = {0}, got = {0};
    const char *why = parse_fields(cJSON_GetObjectItemCaseSensitive(tc, "fields"), &want);
    if (why)
        return why;
    stc_wire_status st = stc_decode(msg, len, &got);
    if (st != STC_WIRE_OK)
        return stc_wire_strerror(st);
    if ((why = compare_headers(&got, &want)) != NULL)
        return why;

    const cJSON *inl = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "fields"), "inline");
    size_t inl_len = 0;
    uint8_t *inl_bytes = cJSON_IsString(inl) ? unhex(inl->valuestring, &inl_len) : NULL;
    if (inl_bytes == NULL)
        return "bad inline hex in vector";
    if (stc_inline_used(&got) != inl_len || memcmp(msg + STC_HEADER_LEN, inl_bytes, inl_len) != 0)
        why = "inline bytes differ";

    /* Encode from the vector's fields (not from the decoded header) into a
     * dirty buffer: the encoder must write every byte. */
    uint8_t out[STC_MSG_LEN];
    memset(out, 0xAA, sizeof out);
    if (why == NULL && (st = stc_encode(&want, inl_bytes, out)) != STC_WIRE_OK)
        why = stc_wire_strerror(st);
    if (why == NULL && memcmp(out, msg, STC_MSG_LEN) != 0)
        why = "re-encoding differs";
    free(inl_bytes);
    return why;
}

static void run_vector(const cJSON *tc)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "tcId");
    const cJSON *comment = cJSON_GetObjectItemCaseSensitive(tc, "comment");
    const cJSON *result = cJSON_GetObjectItemCaseSensitive(tc, "result");
    const cJSON *hex = cJSON_GetObjectItemCaseSensitive(tc, "msg");
    int tc_id = cJSON_IsNumber(id) ? id->valueint : -1;
    const char *text = cJSON_IsString(comment) ? comment->valuestring : "?";
    size_t len = 0;
    uint8_t *msg = cJSON_IsString(hex) ? unhex(hex->valuestring, &len) : NULL;
    if (msg == NULL || !cJSON_IsString(result)) {
        record(tc_id, text, "malformed vector");
    } else if (strcmp(result->valuestring, "valid") == 0) {
        record(tc_id, text, check_valid(tc, msg, len));
    } else if (strcmp(result->valuestring, "invalid") == 0) {
        stc_header h;
        record(tc_id, text, stc_decode(msg, len, &h) == STC_WIRE_OK ? "invalid message was accepted" : NULL);
    } else {
        record(tc_id, text, "unknown result");
    }
    free(msg);
}

/* ---- properties beyond the vectors (reported with tcId 0) -------------- */

static void test_encode_rejects(void)
{
    static const struct {
        const char *name;
        stc_header h;
    } cases[] = {
        {"encode rejects kind 0", {.kind = 0}},
        {"encode rejects Invoke with name_len 0", {.kind = STC_INVOKE, .payload_len = 3}},
        {"encode rejects Invoke name past payload", {.kind = STC_INVOKE, .payload_len = 2, .name_len = 3}},
        {"encode rejects Failure without error_kind", {.kind = STC_FAILURE}},
        {"encode rejects error_kind on Completion", {.kind = STC_COMPLETION, .error_kind = 3}},
        {"encode rejects inline payload of 961", {.kind = STC_DISPATCH, .payload_len = 961}},
        {"encode rejects shm on WorkerHello", {.kind = STC_WORKER_HELLO, .flags = STC_FLAG_SHM}},
        {"encode rejects name_len on Dispatch", {.kind = STC_DISPATCH, .payload_len = 3, .name_len = 3}},
    };
    uint8_t msg[STC_MSG_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        record(0, cases[i].name, stc_encode(&cases[i].h, "abc", msg) == STC_WIRE_OK ? "accepted" : NULL);
}

static void test_properties(void)
{
    stc_header h = {.kind = STC_DISPATCH, .payload_len = 5, .call_id = 42, .worker_id = 1}, got;
    uint8_t msg[STC_MSG_LEN];
    stc_encode(&h, "hello", msg);

    /* Decoders ignore bytes of the inline area past the used part. */
    uint8_t dirty[STC_MSG_LEN];
    memcpy(dirty, msg, sizeof dirty);
    memset(dirty + STC_HEADER_LEN + 5, 0xFF, STC_INLINE_MAX - 5);
    record(0, "decode ignores unused inline bytes",
           stc_decode(dirty, sizeof dirty, &got) == STC_WIRE_OK && got.payload_len == 5 ? NULL : "rejected");

    /* send_ts_ns is patched in place, little-endian at offset 40, nothing else moves. */
    memcpy(dirty, msg, sizeof dirty);
    stc_set_send_ts(dirty, 0x0102030405060708ull);
    static const uint8_t ts[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    int ok = memcmp(dirty + STC_OFF_SEND_TS_NS, ts, 8) == 0 && memcmp(dirty, msg, STC_OFF_SEND_TS_NS) == 0 &&
             memcmp(dirty + 48, msg + 48, STC_MSG_LEN - 48) == 0;
    record(0, "set_send_ts writes offset 40 little-endian", ok ? NULL : "wrong bytes");

    /* An Invoke in shm uses exactly name_len inline bytes. */
    stc_header inv = {.kind = STC_INVOKE, .flags = STC_FLAG_SHM, .payload_len = 1u << 20, .name_len = 4};
    record(0, "inline_used of shm Invoke is name_len", stc_inline_used(&inv) == 4 ? NULL : "wrong length");
    record(0, "decode rejects NULL buffer", stc_decode(NULL, STC_MSG_LEN, &got) == STC_WIRE_ERR_LENGTH ? NULL : "accepted");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s message_v1.json\n", argv[0]);
        return 2;
    }
    char *text = read_file(argv[1]);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(doc, "tests");
    const cJSON *count = cJSON_GetObjectItemCaseSensitive(doc, "numberOfTests");
    if (!cJSON_IsArray(tests) || !cJSON_IsNumber(count)) {
        fprintf(stderr, "cannot read test vectors from %s\n", argv[1]);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    record(0, "numberOfTests matches", cJSON_GetArraySize(tests) == count->valueint ? NULL : "count differs");
    const cJSON *tc;
    cJSON_ArrayForEach(tc, tests) run_vector(tc);
    test_encode_rejects();
    test_properties();
    cJSON_Delete(doc);
    free(text);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
