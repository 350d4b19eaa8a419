/* staccato-init: PID 1 of every pooled function container.
 *
 * A pooled container is created ahead of time with this program as its only
 * process (Nuka §III.A's "lightweight pause container"). The engine takes it
 * from the pool by mounting the function's files in, then writes one command
 * to /slot/ctl; init forks and execs it, stays PID 1 to reap orphans (the
 * function itself must not be PID 1: the kernel ignores signals a namespace's
 * init does not handle), and reports on /slot/status. When the command's
 * process ends, init waits for the next one, so a cleaned container can be
 * reused. End-of-file on ctl means the engine is gone: init exits, and the
 * kernel then kills everything left in the PID namespace.
 *
 * ctl message: u32 little-endian length, then NUL-terminated strings:
 *   cwd, log path (stdout and stderr, opened for append), argc as decimal,
 *   argv[0..argc), then environment entries up to the end.
 * status lines: "READY", "STARTED <pid>", "EXIT <pid> <wait status>",
 *   "ERROR <text>" (the command was malformed; nothing was started).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CMD_MAX 65536
#define FIELDS_MAX 512

static volatile pid_t child = -1;
static int status_fd = -1;

static void forward(int sig) {
    if (child > 0) kill(child, sig);
}

static void report(const char *fmt, long a, long b) {
    char line[128];
    int n = snprintf(line, sizeof line, fmt, a, b);
    if (n > 0) (void)!write(status_fd, line, (size_t)n);
}

static int read_full(int fd, char *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)n;
    }
    return 1;
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = forward;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* Non-blocking opens: the engine holds both FIFOs open before it starts
     * us, so if it died meanwhile there is no peer, and we must exit rather
     * than wait forever in open(). Blocking reads from then on. */
    int ctl = open("/slot/ctl", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    status_fd = open("/slot/status", O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (ctl < 0 || status_fd < 0) {
        perror("staccato-init: opening /slot");
        return 111;
    }
    fcntl(ctl, F_SETFL, fcntl(ctl, F_GETFL) & ~O_NONBLOCK);
    fcntl(status_fd, F_SETFL, fcntl(status_fd, F_GETFL) & ~O_NONBLOCK);
    (void)!write(status_fd, "READY\n", 6);
    static char buf[CMD_MAX + 1];
    static char *fields[FIELDS_MAX + 1];
    for (;;) {
        unsigned char hdr[4];
        int r = read_full(ctl, (char *)hdr, 4);
        if (r <= 0) return 0;
        uint32_t len = hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (uint32_t)hdr[3] << 24;
        if (len > CMD_MAX) {
            (void)!write(status_fd, "ERROR command too long\n", 23);
            return 112; /* the stream cannot be resynchronised */
        }
        if (read_full(ctl, buf, len) <= 0) return 0;
        buf[len] = 0;
        int n = 0;
        for (char *p = buf; p < buf + len && n < FIELDS_MAX; p += strlen(p) + 1) fields[n++] = p;
        fields[n] = NULL;
        long argc = n >= 3 ? strtol(fields[2], NULL, 10) : 0;
        if (argc < 1 || 3 + argc > n) {
            (void)!write(status_fd, "ERROR malformed command\n", 24);
            continue;
        }
        static char *argv[FIELDS_MAX + 1];
        memcpy(argv, &fields[3], (size_t)argc * sizeof *argv);
        argv[argc] = NULL;
        char **envp = &fields[3 + argc];
        pid_t pid = fork();
        if (pid == 0) {
            signal(SIGTERM, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            setsid();
            /* The log is a FIFO the engine reads: opened without blocking
             * (no reader means the engine is gone), then made blocking. */
            int log = open(fields[1], O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK);
            if (log >= 0) fcntl(log, F_SETFL, fcntl(log, F_GETFL) & ~O_NONBLOCK);
            int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (log >= 0) {
                dup2(log, 1);
                dup2(log, 2);
            }
            if (null >= 0) dup2(null, 0);
            if (chdir(fields[0]) != 0) {
                dprintf(2, "staccato-init: chdir %s: %s\n", fields[0], strerror(errno));
                _exit(126);
            }
            execve(argv[0], argv, envp);
            dprintf(2, "staccato-init: exec %s: %s\n", argv[0], strerror(errno));
            _exit(127);
        }
        if (pid < 0) {
            (void)!write(status_fd, "ERROR fork failed\n", 18);
            continue;
        }
        child = pid;
        report("STARTED %ld\n", pid, 0);
        int ws = 0;
        for (;;) {
            pid_t w = wait(&ws);
            if (w == pid) break;
            if (w < 0 && errno != EINTR) break;
        }
        child = -1;
        report("EXIT %ld %ld\n", pid, ws);
        /* Reap orphans the command left behind without blocking; the engine
         * kills any still running before it reuses the container. */
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}
