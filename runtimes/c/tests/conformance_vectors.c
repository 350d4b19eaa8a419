/*
 * conformance_vectors.c - the C runtime's vector program for the shared
 * conformance suite (conformance/README.md, section 1).
 *
 * Usage: conformance_vectors <testvectors/message_v1.json>
 *
 * Runs every test case's message through the runtime's real codec
 * (src/wire.c, the one the workers use) and prints one JSON object per line:
 *
 *   {"tcId":7,"decoded":true,"fields":{...},"reencoded":"<hex>"}
 *   {"tcId":30,"decoded":false,"error":"unknown message kind"}
 *
 * It does not judge the results (the driver compares them with the vector
 * file).  Exits 0 after printing every case, 1 if the file cannot be read.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vector_util.h"
#include "wire.h"

static const char *const kind_names[] = {NULL,       "LauncherHello", "WorkerHello", "CreateWorker", "StopWorker",
                                         "Dispatch", "Completion",    "Failure",     "Invoke"};


static char *tohex(const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    char *s = malloc(2 * n + 1);
    if (s == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = digits[p[i] >> 4];
        s[2 * i + 1] = digits[p[i] & 15];
    }
    s[2 * n] = 0;
    return s;
}

/* Small integers as JSON numbers, u64 fields as decimal strings (the vector
 * file's conventions). */
static void add_uint(cJSON *obj, const char *key, uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON_AddRawToObject(obj, key, buf);
}

static void add_u64(cJSON *obj, const char *key, uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON_AddStringToObject(obj, key, buf);
}

static cJSON *fields_json(const stc_header *h, const uint8_t *msg)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "kind", kind_names[h->kind]); /* decode accepted it: a known kind */
    add_uint(f, "flags", h->flags);
    add_uint(f, "payload_len", h->payload_len);
    add_u64(f, "call_id", h->call_id);
    add_u64(f, "parent_call_id", h->parent_call_id);
    add_uint(f, "worker_id", h->worker_id);
    add_uint(f, "name_len", h->name_len);
    add_uint(f, "error_kind", h->error_kind);
    add_u64(f, "deadline_us", h->deadline_us);
    add_u64(f, "send_ts_ns", h->send_ts_ns);
    add_uint(f, "aux", h->aux);
    char *inl = tohex(msg + STC_HEADER_LEN, stc_inline_used(h));
    cJSON_AddStringToObject(f, "inline", inl ? inl : "");
    free(inl);
    return f;
}

static cJSON *run_case(const cJSON *tc)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "tcId");
    const cJSON *hex = cJSON_GetObjectItemCaseSensitive(tc, "msg");
    cJSON *out = cJSON_CreateObject();
    add_uint(out, "tcId", cJSON_IsNumber(id) ? (uint64_t)id->valuedouble : 0);
    size_t len = 0;
    uint8_t *msg = cJSON_IsString(hex) ? unhex(hex->valuestring, &len) : NULL;
    if (msg == NULL) {
        cJSON_AddFalseToObject(out, "decoded");
        cJSON_AddStringToObject(out, "error", "malformed msg hex in the vector file");
        return out;
    }
    stc_header h;
    stc_wire_status st = stc_decode(msg, len, &h);
    if (st != STC_WIRE_OK) {
        cJSON_AddFalseToObject(out, "decoded");
        cJSON_AddStringToObject(out, "error", stc_wire_strerror(st));
        free(msg);
        return out;
    }
    cJSON_AddTrueToObject(out, "decoded");
    cJSON_AddItemToObject(out, "fields", fields_json(&h, msg));
    /* Re-encode the decoded fields into a dirty buffer: the encoder must
     * write every byte itself. */
    uint8_t re[STC_MSG_LEN];
    memset(re, 0xAA, sizeof re);
    st = stc_encode(&h, msg + STC_HEADER_LEN, re);
    if (st == STC_WIRE_OK) {
        char *rehex = tohex(re, sizeof re);
        cJSON_AddStringToObject(out, "reencoded", rehex ? rehex : "");
        free(rehex);
    } else {
        cJSON_AddNullToObject(out, "reencoded");
        cJSON_AddStringToObject(out, "error", stc_wire_strerror(st));
    }
    free(msg);
    return out;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s message_v1.json\n", argv[0]);
        return 2;
    }
    const char *path = argv[argc - 1];
    char *text = read_file(path);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(doc, "tests");
    if (!cJSON_IsArray(tests)) {
        fprintf(stderr, "%s: cannot read test vectors from %s\n", argv[0], path);
        return 1;
    }
    const cJSON *tc;
    cJSON_ArrayForEach(tc, tests)
    {
        cJSON *line = run_case(tc);
        char *s = cJSON_PrintUnformatted(line);
        if (s == NULL) {
            fprintf(stderr, "%s: out of memory\n", argv[0]);
            return 1;
        }
        puts(s);
        cJSON_free(s);
        cJSON_Delete(line);
    }
    cJSON_Delete(doc);
    free(text);
    return fflush(stdout) == 0 ? 0 : 1;
}
