/*
 * shm.h - shared-memory payload files (docs/protocol.md, "Shared-memory
 * payload files"): $STACCATO_IPC_DIR/shm/<call_id as %016llx>.<i|o>.
 */
#ifndef STACCATO_SHM_H
#define STACCATO_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define STC_SHM_INPUT 'i'  /* Dispatch, Invoke */
#define STC_SHM_OUTPUT 'o' /* Completion, Failure */

/* The suffix of a payload file announced by a message of this kind. */
static inline char stc_shm_suffix(uint16_t kind)
{
    return kind == STC_DISPATCH || kind == STC_INVOKE ? STC_SHM_INPUT : STC_SHM_OUTPUT;
}

/* Writes shm_dir/<call_id as 16 lowercase hex>.<suffix> into buf.  Returns
 * 0, or -1 with errno ENAMETOOLONG. */
int stc_shm_path(char *buf, size_t cap, const char *shm_dir, uint64_t call_id, char suffix);

/* Sender side: creates (or truncates) the file and writes all len bytes
 * before returning, so the message announcing it may be sent next.
 * Returns 0, or -1 with errno set (a partial file is removed). */
int stc_shm_write(const char *shm_dir, uint64_t call_id, char suffix, const void *data, size_t len);

/* Receiver side, zero copy: maps the file read-only and unlinks it.  The
 * file must be exactly len bytes (else -1/EPROTO).  *addr is NULL when
 * len == 0.  Returns 0, or -1 with errno set; the file is unlinked either way. */
int stc_shm_map(const char *shm_dir, uint64_t call_id, char suffix, size_t len, const void **addr);
void stc_shm_unmap(const void *addr, size_t len);

/* Receiver side, copying: reads the file into a new malloc'd buffer of
 * len + 1 bytes (NUL-terminated) and unlinks it. */
int stc_shm_read_alloc(const char *shm_dir, uint64_t call_id, char suffix, size_t len, uint8_t **out);

/* Removes the file, ignoring errors (used for payloads that are dropped). */
void stc_shm_unlink(const char *shm_dir, uint64_t call_id, char suffix);

#endif /* STACCATO_SHM_H */
