/* diskfault: a disk that fails on command, for one process.

   Loaded with LD_PRELOAD. The file named by TIDEMQ_DISKFAULT_CONTROL holds the faults armed right
   now, one a line:

       <call> <errno> <path part>

   <call> is fdatasync, fsync, msync, write (write and pwrite, regular files only), fallocate
   (fallocate and posix_fallocate) or ftruncate; <errno> is EIO or ENOSPC; the fault hits a call
   on a file whose path contains <path part>. A missing or empty file arms nothing. The file is
   read again whenever it changes (checked by stat on every intercepted call), so a test arms and
   disarms a running process by rewriting it (write a new file and rename it over the old one).

   msync names an address, not a file: mmap and munmap are tracked so msync can find the file
   the address belongs to. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_RULES 16
#define MAX_MAPS 4096
#define PATH_LEN 512

enum call { C_FDATASYNC, C_FSYNC, C_MSYNC, C_WRITE, C_FALLOCATE, C_FTRUNCATE, C_COUNT };

static const char *CALL_NAMES[C_COUNT] = {"fdatasync", "fsync",     "msync",
                                          "write",     "fallocate", "ftruncate"};

struct rule {
    int call;
    int err;
    char part[PATH_LEN];
};

struct region {
    char *start;
    size_t len;
    char path[PATH_LEN];
};

/* Recursive: reading the control file may allocate, and an allocator may munmap. */
static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static struct rule rules[MAX_RULES];
static int nrules;
static int armed_calls[C_COUNT];
static struct timespec seen_mtime;
static ino_t seen_ino;
static off_t seen_size = -1;
static struct region maps[MAX_MAPS];

static void reload_locked(void) {
    const char *control = getenv("TIDEMQ_DISKFAULT_CONTROL");
    struct stat st;
    if (control == NULL || stat(control, &st) != 0) {
        nrules = 0;
        memset(armed_calls, 0, sizeof armed_calls);
        seen_size = -1;
        return;
    }
    if (st.st_ino == seen_ino && st.st_size == seen_size &&
        st.st_mtim.tv_sec == seen_mtime.tv_sec && st.st_mtim.tv_nsec == seen_mtime.tv_nsec)
        return;
    seen_ino = st.st_ino;
    seen_size = st.st_size;
    seen_mtime = st.st_mtim;
    nrules = 0;
    memset(armed_calls, 0, sizeof armed_calls);
    FILE *f = fopen(control, "re");
    if (f == NULL)
        return;
    char call[32], err[32], part[PATH_LEN];
    while (nrules < MAX_RULES && fscanf(f, "%31s %31s %511s", call, err, part) == 3) {
        int c = -1;
        for (int i = 0; i < C_COUNT; i++)
            if (strcmp(call, CALL_NAMES[i]) == 0)
                c = i;
        int e = strcmp(err, "EIO") == 0 ? EIO : strcmp(err, "ENOSPC") == 0 ? ENOSPC : 0;
        if (c < 0 || e == 0)
            continue;
        rules[nrules].call = c;
        rules[nrules].err = e;
        snprintf(rules[nrules].part, PATH_LEN, "%s", part);
        armed_calls[c] = 1;
        nrules++;
    }
    fclose(f);
}

/* The errno to fail ``call`` on ``path`` with, or 0. */
static int fault_for(int call, const char *path) {
    int err = 0;
    pthread_mutex_lock(&lock);
    reload_locked();
    for (int i = 0; i < nrules && path != NULL; i++)
        if (rules[i].call == call && strstr(path, rules[i].part) != NULL) {
            err = rules[i].err;
            break;
        }
    pthread_mutex_unlock(&lock);
    return err;
}

static int is_armed(int call) {
    pthread_mutex_lock(&lock);
    reload_locked();
    int armed = armed_calls[call];
    pthread_mutex_unlock(&lock);
    return armed;
}

static int fd_path(int fd, char *out) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_LEN - 1);
    if (n < 0)
        return -1;
    out[n] = 0;
    return 0;
}

static int fd_fault(int call, int fd) {
    if (!is_armed(call))
        return 0;
    char path[PATH_LEN];
    if (fd_path(fd, path) != 0)
        return 0;
    return fault_for(call, path);
}

static int write_fault(int fd) {
    if (!is_armed(C_WRITE))
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    return fd_fault(C_WRITE, fd);
}

static int (*real_fdatasync)(int);
static int (*real_fsync)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static int (*real_posix_fallocate)(int, off_t, off_t);
static int (*real_posix_fallocate64)(int, off_t, off_t);
static int (*real_fallocate)(int, int, off_t, off_t);
static int (*real_ftruncate)(int, off_t);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off_t);
static int (*real_munmap)(void *, size_t);
static int (*real_msync)(void *, size_t, int);

/* Resolved once, before the program runs: dlsym may allocate, and must not do so from inside
   an intercepted mmap. */
__attribute__((constructor)) static void resolve(void) {
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_posix_fallocate = dlsym(RTLD_NEXT, "posix_fallocate");
    real_posix_fallocate64 = dlsym(RTLD_NEXT, "posix_fallocate64");
    real_fallocate = dlsym(RTLD_NEXT, "fallocate");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_mmap = dlsym(RTLD_NEXT, "mmap");
    real_mmap64 = dlsym(RTLD_NEXT, "mmap64");
    real_munmap = dlsym(RTLD_NEXT, "munmap");
    real_msync = dlsym(RTLD_NEXT, "msync");
}

#define REAL(name) (real_##name ? real_##name : (resolve(), real_##name))

int fdatasync(int fd) {
    int err = fd_fault(C_FDATASYNC, fd);
    if (err) {
        errno = err;
        return -1;
    }
    return REAL(fdatasync)(fd);
}

int fsync(int fd) {
    int err = fd_fault(C_FSYNC, fd);
    if (err) {
        errno = err;
        return -1;
    }
    return REAL(fsync)(fd);
}

ssize_t write(int fd, const void *buf, size_t count) {
    int err = write_fault(fd);
    if (err) {
        errno = err;
        return -1;
    }
    return REAL(write)(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    int err = write_fault(fd);
    if (err) {
        errno = err;
        return -1;
    }
    return REAL(pwrite)(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    int err = write_fault(fd);
    if (err) {
        errno = err;
        return -1;
    }
    return REAL(pwrite64)(fd, buf, count, offset);
}

int posix_fallocate(int fd, off_t offset, off_t len) {
    int err = fd_fault(C_FALLOCATE, fd);
    if (err)
        return err; /* posix_fallocate returns the error number */
    return REAL(posix_fallocate)(fd, offset, len);
}

int posix_fallocate64(int fd, off_t offset, off_t len) {
    int err = fd_fault(C_FALLOCATE, fd);
    if (err)
        return err;
    return REAL(posix_fallocate64)(fd, offset, len);
}

int fallocate(int fd, int mode, off_t offset, off_t len) {
    int err = fd_fault(C_FALLOCATE, fd);
    if (err) {
        errno = err;
        return -1;
    }
    return REAL(fallocate)(fd, mode, offset, len);
}

int ftruncate(int fd, off_t length) {
    int err = fd_fault(C_FTRUNCATE, fd);
    if (err) {
        errno = err;
        return -1;
    }
    return REAL(ftruncate)(fd, length);
}

static void track(void *addr, size_t len, int fd) {
    char path[PATH_LEN];
    if (addr == MAP_FAILED || fd < 0 || fd_path(fd, path) != 0)
        return;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].start == NULL) {
            maps[i].start = addr;
            maps[i].len = len;
            memcpy(maps[i].path, path, PATH_LEN);
            break;
        }
    pthread_mutex_unlock(&lock);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset) {
    void *p = REAL(mmap)(addr, len, prot, flags, fd, offset);
    if (flags & MAP_SHARED)
        track(p, len, fd);
    return p;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t offset) {
    void *p = REAL(mmap64)(addr, len, prot, flags, fd, offset);
    if (flags & MAP_SHARED)
        track(p, len, fd);
    return p;
}

int munmap(void *addr, size_t len) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].start == addr)
            maps[i].start = NULL;
    pthread_mutex_unlock(&lock);
    return REAL(munmap)(addr, len);
}

int msync(void *addr, size_t len, int flags) {
    if (is_armed(C_MSYNC)) {
        char path[PATH_LEN] = "";
        pthread_mutex_lock(&lock);
        for (int i = 0; i < MAX_MAPS; i++)
            if (maps[i].start != NULL && (char *)addr >= maps[i].start &&
                (char *)addr < maps[i].start + maps[i].len) {
                memcpy(path, maps[i].path, PATH_LEN);
                break;
            }
        pthread_mutex_unlock(&lock);
        int err = path[0] ? fault_for(C_MSYNC, path) : 0;
        if (err) {
            errno = err;
            return -1;
        }
    }
    return REAL(msync)(addr, len, flags);
}
