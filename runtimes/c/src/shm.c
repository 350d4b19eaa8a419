/* shm.c - shared-memory payload files; see shm.h. */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int stc_shm_path(char *buf, size_t cap, const char *shm_dir, uint64_t call_id, char suffix)
{
    int n = snprintf(buf, cap, "%s/%016llx.%c", shm_dir, (unsigned long long)call_id, suffix);
    if (n < 0 || (size_t)n >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

static int write_all(int fd, const uint8_t *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int stc_shm_write(const char *shm_dir, uint64_t call_id, char suffix, const void *data, size_t len)
{
    char path[PATH_MAX];
    if (stc_shm_path(path, sizeof path, shm_dir, call_id, suffix) < 0)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int rc = write_all(fd, data, len);
    int saved = errno;
    if (close(fd) < 0 && rc == 0) {
        rc = -1;
        saved = errno;
    }
    if (rc < 0) {
        unlink(path);
        errno = saved;
    }
    return rc;
}

/* Opens the file and checks that it holds exactly len bytes, so a truncated
 * or stale file is reported instead of being read past its end. */
static int open_checked(const char *path, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    if ((uint64_t)st.st_size != (uint64_t)len) {
        close(fd);
        errno = EPROTO;
        return -1;
    }
    return fd;
}

int stc_shm_map(const char *shm_dir, uint64_t call_id, char suffix, size_t len, const void **addr)
{
    char path[PATH_MAX];
    *addr = NULL;
    if (stc_shm_path(path, sizeof path, shm_dir, call_id, suffix) < 0)
        return -1;
    int rc = 0, saved = 0;
    int fd = open_checked(path, len);
    if (fd < 0) {
        rc = -1;
        saved = errno;
    } else if (len > 0) {
        /* MAP_POPULATE: the pages are already in tmpfs; mapping them all now
         * is cheaper than one fault per page inside the handler. */
        void *p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) {
            rc = -1;
            saved = errno;
        } else {
            *addr = p;
        }
    }
    if (fd >= 0)
        close(fd);
    unlink(path); /* the mapping keeps the data alive */
    errno = saved;
    return rc;
}

void stc_shm_unmap(const void *addr, size_t len)
{
    if (addr != NULL && len > 0)
        munmap((void *)addr, len);
}

static int read_all(int fd, uint8_t *p, size_t len)
{
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EPROTO; /* file shrank under us */
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int stc_shm_read_alloc(const char *shm_dir, uint64_t call_id, char suffix, size_t len, uint8_t **out)
{
    char path[PATH_MAX];
    *out = NULL;
    if (stc_shm_path(path, sizeof path, shm_dir, call_id, suffix) < 0)
        return -1;
    int fd = open_checked(path, len);
    int rc = -1, saved = errno;
    if (fd >= 0) {
        uint8_t *buf = malloc(len + 1);
        if (buf == NULL) {
            saved = ENOMEM;
        } else if (read_all(fd, buf, len) < 0) {
            saved = errno;
            free(buf);
        } else {
            buf[len] = 0;
            *out = buf;
            rc = 0;
        }
        close(fd);
    }
    unlink(path);
    errno = saved;
    return rc;
}

void stc_shm_unlink(const char *shm_dir, uint64_t call_id, char suffix)
{
    char path[PATH_MAX];
    if (stc_shm_path(path, sizeof path, shm_dir, call_id, suffix) == 0)
        unlink(path);
}
