#include <staccato.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Sleeps for the given milliseconds; returns pid and start/end times (µs). */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    char ms_text[16] = {0};
    size_t n = input_len < sizeof ms_text - 1 ? input_len : sizeof ms_text - 1;
    for (size_t i = 0; i < n; i++) ms_text[i] = (char)input[i];
    long ms = n ? strtol(ms_text, NULL, 10) : 100;
    struct timespec a, b;
    clock_gettime(CLOCK_REALTIME, &a);
    usleep((useconds_t)(ms * 1000));
    clock_gettime(CLOCK_REALTIME, &b);
    char out[128];
    int len = snprintf(out, sizeof out, "{\"pid\":%d,\"start_us\":%lld,\"end_us\":%lld}", (int)getpid(),
                       (long long)a.tv_sec * 1000000 + a.tv_nsec / 1000, (long long)b.tv_sec * 1000000 + b.tv_nsec / 1000);
    staccato_set_output(ctx, out, (size_t)len);
    return 0;
}
