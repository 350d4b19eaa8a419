/*
 * runtime.h - pieces shared by the launcher (host.c) and the worker
 * (worker.c) of staccato-c-host.
 */
#ifndef STACCATO_RUNTIME_H
#define STACCATO_RUNTIME_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "staccato.h"

typedef int (*stc_handle_fn)(staccato_ctx *ctx, const uint8_t *input, size_t input_len);

/* Settings from the environment (docs/protocol.md, "Launchers and workers"). */
typedef struct stc_config {
    const char *function;     /* STACCATO_FUNCTION */
    const char *ipc_dir;      /* STACCATO_IPC_DIR: $IPC/<function> */
    char shm_dir[PATH_MAX];   /* $STACCATO_IPC_DIR/shm */
    const char *handler_path; /* STACCATO_HANDLER: the user's shared library */
    size_t payload_max;       /* STACCATO_PAYLOAD_MAX */
    long spin_us;             /* STACCATO_SPIN_US */
    stc_handle_fn handle;     /* staccato_handle from the handler library */
} stc_config;

/* Makes cfg visible to the staccato_* API (staccato_log works from then on,
 * e.g. in the handler library's constructors). */
void stc_runtime_init(const stc_config *cfg);

/* Runs worker worker_id in this freshly forked process: opens its channel,
 * sends WorkerHello and serves Dispatch messages until StopWorker or end of
 * file on e2w.  Never returns. */
_Noreturn void stc_worker_main(const stc_config *cfg, uint32_t worker_id);

/* Host diagnostics: one line "staccato-c-host[<function>:<pid>]: ..." on
 * stderr, written with a single write(2) so lines of several processes
 * sharing stderr do not interleave. */
void stc_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* STACCATO_RUNTIME_H */
