/* The floor for the external path: a plain HTTP/1.1 keep-alive server that
 * answers every request 200 with an empty body, one epoll thread, no
 * parsing beyond finding the end of each request head (the requests it is
 * sent carry a 2-byte body, which it skips). Loopback only.
 *
 *   plain PORT
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: plain PORT\n"); return 2; }
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 128)) { perror("bind"); return 1; }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    static const char resp[] = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    static char buf[65536];
    for (;;) {
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == l) {
                int c = accept(l, NULL, NULL);
                if (c < 0) continue;
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
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
