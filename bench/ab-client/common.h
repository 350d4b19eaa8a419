/* Shared by the C benchmark programs of this directory (each is one .c
 * file built alone: `gcc -O2 -o NAME NAME.c -lm`). */
#ifndef STACCATO_AB_COMMON_H
#define STACCATO_AB_COMMON_H

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>

static inline double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* For qsort of doubles. */
static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest rank (as `staccato bench run` reports): the smallest value with
 * at least per_mille/1000 of the sorted samples at or below it. */
static inline double rank(const double *sorted, int n, int per_mille) {
    long r = ((long)n * per_mille + 999) / 1000; /* ceil */
    return sorted[r < 1 ? 0 : r - 1];
}

/* A socket listening on 127.0.0.1:port, in a new epoll set (*ep); exits
 * the program if it cannot. */
static inline int listen_loopback(int port, int *ep) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 128)) { perror("bind"); exit(1); }
    *ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
    epoll_ctl(*ep, EPOLL_CTL_ADD, l, &ev);
    return l;
}

/* Accepts a connection on `l` (TCP_NODELAY) into the epoll set `ep`. */
static inline void accept_into(int l, int ep) {
    int c = accept(l, NULL, NULL), one = 1;
    if (c < 0) return;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
}

#endif
