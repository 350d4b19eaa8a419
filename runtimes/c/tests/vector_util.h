/* Helpers shared by the programs that read the testvectors/ JSON files: test_wire.c
 * and conformance_vectors.c. Header-only (static) so each stays a single
 * translation unit in the Makefile. */
#ifndef STACCATO_VECTOR_UTIL_H
#define STACCATO_VECTOR_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)len + 1);
        if (buf != NULL && fread(buf, 1, (size_t)len, f) != (size_t)len) {
            free(buf);
            buf = NULL;
        }
        if (buf != NULL)
            buf[len] = 0;
    }
    fclose(f);
    return buf;
}

static inline int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes a hex string into a new buffer; returns NULL on malformed hex. */
static inline uint8_t *unhex(const char *hex, size_t *len)
{
    size_t n = strlen(hex);
    if (n % 2 != 0)
        return NULL;
    uint8_t *out = malloc(n / 2 + 1); /* +1: never malloc(0) */
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(out);
            return NULL;
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    *len = n / 2;
    return out;
}

/* The code of a message kind named as in the vectors ("Dispatch"), or -1. */
static inline int kind_code(const char *name)
{
    static const char *const names[] = {NULL,       "LauncherHello", "WorkerHello", "CreateWorker", "StopWorker",
                                        "Dispatch", "Completion",    "Failure",     "Invoke"};
    for (int i = 1; i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

#endif
