/* Closed-loop latency of several HTTP servers measured in one run, call by
 * call in turn (server 1, server 2, ..., server 1, ...), so the drift of a
 * shared machine hits every one alike. One keep-alive connection each.
 *
 *   alternate CALLS PORT:PATH [PORT:PATH ...]
 *
 * Prints, per server, p50/p90/p99/p99.9 in microseconds. Optional
 * environment: GAP_US (mean of exponential gaps between rounds: an open
 * loop at 1e6/GAP_US rounds a second; 0, the default: back to back).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

#define MAXS 8

/* Reads one response (head + Content-Length body). */
static int read_response(int fd, char *buf, size_t cap) {
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r <= 0) return -1;
        n += (size_t)r;
        buf[n] = 0;
        char *end = strstr(buf, "\r\n\r\n");
        if (!end) continue;
        char *cl = strcasestr(buf, "content-length:");
        size_t want = (size_t)(end + 4 - buf) + (cl ? strtoul(cl + 15, NULL, 10) : 0);
        if (n >= want) return strncmp(buf, "HTTP/1.1 200", 12) == 0 ? 0 : -2;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: alternate CALLS PORT:PATH [PORT:PATH ...]\n");
        return 2;
    }
    int calls = atoi(argv[1]), ns = argc - 2;
    double gap = getenv("GAP_US") ? atof(getenv("GAP_US")) : 0;
    int fds[MAXS];
    char reqs[MAXS][256];
    double *lat[MAXS];
    srand48(42);
    for (int i = 0; i < ns && i < MAXS; i++) {
        int port = atoi(argv[i + 2]);
        const char *path = strchr(argv[i + 2], ':') + 1;
        snprintf(reqs[i], sizeof reqs[i], "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\nhi", path);
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fds[i], (struct sockaddr *)&a, sizeof a) != 0) { perror("connect"); return 1; }
        lat[i] = calloc(calls, sizeof(double));
    }
    static char buf[1 << 16];
    for (int c = 0; c < calls; c++) {
        for (int i = 0; i < ns; i++) {
            if (gap > 0) {
                double g = -log(1 - drand48()) * gap / ns;
                usleep((useconds_t)g);
            }
            double t0 = now_us();
            if (write(fds[i], reqs[i], strlen(reqs[i])) < 0) { perror("write"); return 1; }
            int r = read_response(fds[i], buf, sizeof buf);
            if (r != 0) { fprintf(stderr, "server %d: bad response (%d): %.200s\n", i, r, buf); return 1; }
            lat[i][c] = now_us() - t0;
        }
    }
    for (int i = 0; i < ns; i++) {
        qsort(lat[i], calls, sizeof(double), cmp_double);
        printf("%-28s p50 %7.1f  p90 %7.1f  p99 %7.1f  p99.9 %7.1f  n %d\n", argv[i + 2], rank(lat[i], calls, 500),
               rank(lat[i], calls, 900), rank(lat[i], calls, 990), rank(lat[i], calls, 999), calls);
    }
    return 0;
}
