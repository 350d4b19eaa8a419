/*
 * test_contract.c - checks the C runtime's file naming against
 * testvectors/contract_v1.json: payload files (stc_shm_suffix, stc_shm_path)
 * and channel FIFOs (stc_chan_path).  run_tests.py checks the error kind
 * macros and the environment variables.  Usage: test_contract
 * <contract_v1.json>.  Last line: "N passed, N failed".
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "shm.h"
#include "vector_util.h"

static int passed, failed;

static void check(int ok, const char *what, const char *got, const char *want)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL %s: got %s, want %s\n", what, got, want);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s contract_v1.json\n", argv[0]);
        return 2;
    }
    char *text = read_file(argv[1]);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    if (doc == NULL) {
        printf("cannot read %s\n0 passed, 1 failed\n", argv[1]);
        return 1;
    }
    char got[256];
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(doc, "payload_files"))
    {
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(f, "call_id"));
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(f, "kind"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(f, "path"));
        int code = kind ? kind_code(kind) : -1;
        if (id == NULL || want == NULL || code < 0) {
            check(0, "payload_files entry", "malformed", "call_id, kind, path");
            continue;
        }
        uint64_t call_id = strtoull(id, NULL, 10);
        int rc = stc_shm_path(got, sizeof got, "shm", call_id, stc_shm_suffix((uint16_t)code));
        check(rc == 0 && strcmp(got, want) == 0, "payload file", got, want);
    }
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(doc, "channel_files"))
    {
        uint32_t id = (uint32_t)cJSON_GetNumberValue(cJSON_GetObjectItem(f, "id"));
        const char *ends[] = {"e2w", "w2e"};
        for (int i = 0; i < 2; i++) {
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(f, ends[i]));
            char want[256];
            snprintf(want, sizeof want, "/ipc/%s", name ? name : "?");
            int rc = stc_chan_path(got, sizeof got, "/ipc", id, ends[i]);
            check(name != NULL && rc == 0 && strcmp(got, want) == 0, "channel file", got, want);
        }
    }
    /* A name that does not fit is refused, not cut. */
    check(stc_shm_path(got, 8, "shm", 1, 'i') == -1, "short buffer", "accepted", "ENAMETOOLONG");
    cJSON_Delete(doc);
    free(text);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
