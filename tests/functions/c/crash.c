#include <staccato.h>
#include <signal.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>

/* "crash" kills the worker mid-call; anything else is echoed with the pid. */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    if (input_len == 5 && memcmp(input, "crash", 5) == 0) {
        raise(SIGSEGV);
    }
    char buf[64];
    int n = snprintf(buf, sizeof buf, "pid=%d", (int)getpid());
    staccato_set_output(ctx, buf, (size_t)n);
    return 0;
}
