/*
 * host.c - staccato-c-host, the launcher of C functions.
 *
 * Started by the engine once per function (docs/protocol.md, "Launchers and
 * workers").  It loads the user's handler library, opens channel 0, sends
 * LauncherHello and forks one worker process per CreateWorker.  Workers are
 * forked from a process that has already loaded the handler, so a new worker
 * costs a fork, not a dlopen.
 */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "channel.h"
#include "runtime.h"
#include "wire.h"

#define DEFAULT_PAYLOAD_MAX 6291456u
#define SPIN_US_MAX 1000000L /* spinning longer than 1 s is surely a typo */

void stc_logf(const char *fmt, ...)
{
    static const char *function; /* cached: getenv on every log line is wasteful */
    if (function == NULL)
        function = getenv("STACCATO_FUNCTION") ? getenv("STACCATO_FUNCTION") : "?";
    char line[1024];
    int n = snprintf(line, sizeof line - 1, "staccato-c-host[%s:%ld]: ", function, (long)getpid());
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line - 1 ? (size_t)n : sizeof line - 2;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(line + len, sizeof line - 1 - len, fmt, ap);
    va_end(ap);
    if (n > 0)
        len += (size_t)n < sizeof line - 1 - len ? (size_t)n : sizeof line - 2 - len;
    line[len++] = '\n';
    ssize_t w;
    do
        w = write(STDERR_FILENO, line, len);
    while (w < 0 && errno == EINTR);
}

static _Noreturn void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static _Noreturn void fatal(const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    stc_logf("%s", msg);
    exit(1);
}

/* ---- configuration ----------------------------------------------------- */

static const char *env_required(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        fatal("environment variable %s is not set", name);
    return v;
}

/* Parses a decimal environment variable in [min, max]; dflt when unset. */
static long long env_number(const char *name, long long dflt, long long min, long long max)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno != 0 || *end != '\0' || n < min || n > max)
        fatal("%s=%s: expected an integer in [%lld, %lld]", name, v, min, max);
    return n;
}

static void load_config(stc_config *cfg)
{
    cfg->function = env_required("STACCATO_FUNCTION");
    cfg->ipc_dir = env_required("STACCATO_IPC_DIR");
    cfg->handler_path = env_required("STACCATO_HANDLER");
    /* payload_len is a u32 on the wire. */
    cfg->payload_max = (size_t)env_number("STACCATO_PAYLOAD_MAX", DEFAULT_PAYLOAD_MAX, 0, UINT32_MAX);
    cfg->spin_us = (long)env_number("STACCATO_SPIN_US", 0, 0, SPIN_US_MAX);
    int n = snprintf(cfg->shm_dir, sizeof cfg->shm_dir, "%s/shm", cfg->ipc_dir);
    if (n < 0 || (size_t)n >= sizeof cfg->shm_dir)
        fatal("STACCATO_IPC_DIR is too long");
}

/* Loads the handler library and resolves staccato_handle.  Done before
 * channel 0 is opened, so a broken handler makes the launcher exit with a
 * clear message instead of half-completing the handshake. */
static void load_handler(stc_config *cfg)
{
    char path[PATH_MAX];
    /* dlopen searches the library path for a bare name; the engine means a
     * file in the function's code directory (our working directory). */
    const char *fmt = strchr(cfg->handler_path, '/') ? "%s" : "./%s";
    int n = snprintf(path, sizeof path, fmt, cfg->handler_path);
    if (n < 0 || (size_t)n >= sizeof path)
        fatal("STACCATO_HANDLER is too long");
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        fatal("cannot load handler %s: %s", path, dlerror());
    dlerror();
    void *sym = dlsym(lib, "staccato_handle");
    const char *err = dlerror();
    if (sym == NULL || err != NULL)
        fatal("handler %s does not export staccato_handle: %s", path, err ? err : "symbol is NULL");
    cfg->handle = (stc_handle_fn)sym;
}

/* ---- process management ------------------------------------------------ */

/* Reaps exited workers so none stays a zombie.  Workers report their own
 * death to the engine (end of file on w2e), so statuses are not needed. */
static void reap_children(int sig)
{
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = reap_children;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) < 0)
        fatal("sigaction(SIGCHLD): %s", strerror(errno));
    /* A dead engine must show up as EPIPE on write, not kill us silently. */
    signal(SIGPIPE, SIG_IGN);
}

/* Child side of the fork: tie our life to the launcher's, drop what belongs
 * to the launcher, and become worker worker_id. */
static _Noreturn void become_worker(const stc_config *cfg, stc_chan *ch0, pid_t launcher, uint32_t worker_id)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        _exit(1);
    if (getppid() != launcher) /* the launcher died before prctl took effect */
        _exit(1);
    /* The launcher's reaper would steal the exit status of processes the
     * handler starts and waits for. */
    signal(SIGCHLD, SIG_DFL);
    stc_chan_close(ch0);
    stc_worker_main(cfg, worker_id);
}

static void spawn_worker(const stc_config *cfg, stc_chan *ch0, uint32_t worker_id)
{
    fflush(NULL); /* or buffered stdio output would be written twice */
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0)
        become_worker(cfg, ch0, launcher, worker_id);
    if (pid < 0)
        /* There is no message to report this; the engine's wait for
         * WorkerHello times out. */
        stc_logf("cannot fork worker %u: %s", (unsigned)worker_id, strerror(errno));
}

/* ---- launcher ---------------------------------------------------------- */

static _Noreturn void run_launcher(const stc_config *cfg)
{
    stc_chan ch0;
    /* The launcher never spins: CreateWorker is rare, idle CPU is not. */
    if (stc_chan_open(&ch0, cfg->ipc_dir, 0, 0) < 0)
        fatal("cannot open channel 0 in %s: %s", cfg->ipc_dir, strerror(errno));
    static _Alignas(64) uint8_t msg[STC_MSG_LEN];
    stc_header hello = {.kind = STC_LAUNCHER_HELLO, .aux = (uint32_t)getpid()};
    if (stc_encode(&hello, NULL, msg) != STC_WIRE_OK || stc_chan_send(&ch0, msg) < 0)
        fatal("cannot send LauncherHello: %s", strerror(errno));
    for (;;) {
        int r = stc_chan_recv(&ch0, msg);
        if (r == 0) /* engine closed channel 0; PR_SET_PDEATHSIG ends the workers */
            exit(0);
        if (r < 0)
            fatal("channel 0 read failed: %s", strerror(errno));
        stc_header h;
        stc_wire_status st = stc_decode(msg, sizeof msg, &h);
        if (st != STC_WIRE_OK)
            stc_logf("dropping invalid message on channel 0: %s", stc_wire_strerror(st));
        else if (h.kind == STC_CREATE_WORKER && h.worker_id != 0)
            spawn_worker(cfg, &ch0, h.worker_id);
        else
            stc_logf("ignoring message kind %u (worker %u) on channel 0", h.kind, (unsigned)h.worker_id);
    }
}

int main(void)
{
    static stc_config cfg;
    load_config(&cfg);
    stc_runtime_init(&cfg);
    load_handler(&cfg);
    install_signals();
    run_launcher(&cfg);
}
