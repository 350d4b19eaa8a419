/* conf.h - helpers shared by the C conformance functions. */
#ifndef CONF_H
#define CONF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <staccato.h>

/* The protocol's name of an error kind code. */
static inline const char *conf_kind_name(int kind)
{
    static const char *const names[] = {"ok",       "not_found",          "payload_too_large",
                                        "function_error", "worker_crashed", "timeout",
                                        "engine_unavailable", "bad_request", "internal",
                                        "out_of_memory", "output_too_large", "call_cycle",
                                        "call_depth_exceeded", "function_removed", "overloaded"};
    return kind >= 0 && kind < (int)(sizeof names / sizeof names[0]) ? names[kind] : "unknown";
}

/* A growable byte buffer. */
typedef struct conf_buf {
    char *data;
    size_t len, cap;
    int oom;
} conf_buf;

static inline void conf_put(conf_buf *b, const void *p, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (d == NULL) {
            b->oom = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

static inline void conf_puts(conf_buf *b, const char *s) { conf_put(b, s, strlen(s)); }

/* Appends p[0..n) as a JSON string literal.  Bytes >= 0x80 are copied as
 * they are (UTF-8 text stays readable). */
static inline void conf_put_json_string(conf_buf *b, const void *p, size_t n)
{
    const unsigned char *s = p;
    conf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        char esc[8];
        if (s[i] == '"' || s[i] == '\\') {
            esc[0] = '\\';
            esc[1] = (char)s[i];
            conf_put(b, esc, 2);
        } else if (s[i] < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", s[i]);
            conf_put(b, esc, 6);
        } else {
            conf_put(b, &s[i], 1);
        }
    }
    conf_put(b, "\"", 1);
}

/* Sets the output to b's bytes and frees b; fails on out of memory. */
static inline int conf_output(staccato_ctx *ctx, conf_buf *b)
{
    int rc = b->oom ? (staccato_set_error(ctx, "out of memory"), 1) : staccato_set_output(ctx, b->data, b->len);
    free(b->data);
    *b = (conf_buf){0};
    return rc;
}

#endif
