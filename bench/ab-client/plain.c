/* The floor for the external path: a plain HTTP/1.1 keep-alive server that
 * answers every request 200 with an empty body, one epoll thread, no
 * parsing beyond finding the end of each request head (the requests it is
 * sent carry a 2-byte body, which it skips). Loopback only.
 *
 *   plain PORT
 */
#include <string.h>
#include <unistd.h>

#include "common.h"

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: plain PORT\n"); return 2; }
    int ep, l = listen_loopback(atoi(argv[1]), &ep);
    static const char resp[] = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    static char buf[65536];
    for (;;) {
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == l) {
                accept_into(l, ep);
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf - 1);
            if (r <= 0) { close(fd); continue; }
            buf[r] = 0;
            /* One answer per request head in what was read (pipelining). */
            for (char *p = buf; (p = strstr(p, "\r\n\r\n")) != NULL; p += 4)
                if (write(fd, resp, sizeof resp - 1) < 0) break;
        }
    }
}
