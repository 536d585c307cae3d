/* Power loss for one process: a "durable shadow" of its store directory that holds only what a
 * real disk would still hold after the power went out (LazyFS's idea, as an LD_PRELOAD shim).
 *
 * Settings (environment): TIDEMQ_POWERLOSS_WATCH, the directory whose durability is modelled
 * (absolute); TIDEMQ_POWERLOSS_SHADOW, where the shadow is kept. Without both the shim does
 * nothing. tests/faults/powerloss.py rebuilds a directory from its shadow after a SIGKILL.
 *
 * The model, chosen to match ext4 (data=ordered, one journal per filesystem):
 * - File data is durable only once synced: fsync / fdatasync of a descriptor copies the file's
 *   bytes as they were when the call began into the shadow (bytes written during the call may or
 *   may not reach a real disk; the shadow takes the stricter answer); msync(MS_SYNC) copies the
 *   synced range of the mapping (mmap/munmap are tracked to find its file and offset); sync and
 *   syncfs copy every file. A sync that fails copies nothing.
 * - Names and sizes (creation, posix_fallocate, ftruncate, rename, link, unlink, mkdir) become
 *   durable at the next successful sync of any file or directory: ext4 commits every earlier
 *   metadata change in the journal transaction an fsync forces. A rename is therefore not durable
 *   at once, nor does it wait for its own directory's fsync. What the model leaves out: the
 *   journal's own commit every few seconds (stricter than ext4: a name no sync followed is lost).
 * - At start the shim takes the directory as it finds it to be durable: it is what the disk held
 *   when the process started (after a power loss, what powerloss.py rebuilt from the shadow).
 * - Data belongs to the inode, not the name (key: inode number and birth time), so data synced
 *   under a temporary name survives the rename over the target, and hard links share it.
 *
 * Shadow layout: blobs/<key> holds each inode's synced bytes; "namespace" lists, as of the last
 * sync, every directory ("d\t<path>") and regular file ("f\t<key>\t<size>\t<path>"), paths
 * relative to the watched directory. A file is rebuilt as its blob cut or zero-padded to its
 * size: what was never synced reads back as zeros, as preallocated blocks do.
 *
 * Copies are whole files: fine for a test store of small files, not for gigabytes.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* Paths are built in PATH_MAX buffers; a test store's paths are far shorter (init refuses a long
 * shadow root), so gcc's worry that they might be cut is moot here. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_msync)(void *, size_t, int);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off_t);
static int (*real_munmap)(void *, size_t);
static void (*real_sync)(void);
static int (*real_syncfs)(int);

static char watch[PATH_MAX];
static size_t watch_len;
static char shadow[PATH_MAX];
static int enabled;
/* One sync at a time: the shadow moves from one consistent state to the next. */
static pthread_mutex_t sync_lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_MAPS 4096
struct mapping {
    char *addr;
    size_t len;
    off_t offset;
    char key[64];
};
static struct mapping maps[MAX_MAPS];
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;

static int snapshot_names(int copy_all);
static void commit_names(int ok);

static void resolve(void) {
    if (real_fsync) return;
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_msync = dlsym(RTLD_NEXT, "msync");
    real_mmap = dlsym(RTLD_NEXT, "mmap");
    real_mmap64 = dlsym(RTLD_NEXT, "mmap64");
    real_munmap = dlsym(RTLD_NEXT, "munmap");
    real_sync = dlsym(RTLD_NEXT, "sync");
    real_syncfs = dlsym(RTLD_NEXT, "syncfs");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
}

__attribute__((constructor)) static void init(void) {
    resolve();
    const char *w = getenv("TIDEMQ_POWERLOSS_WATCH");
    const char *s = getenv("TIDEMQ_POWERLOSS_SHADOW");
    if (!w || !s || w[0] != '/' || !s[0] || strlen(w) >= PATH_MAX - 1 || strlen(s) >= PATH_MAX - 64)
        return;
    snprintf(watch, sizeof watch, "%s", w);
    watch_len = strlen(watch);
    while (watch_len > 1 && watch[watch_len - 1] == '/') watch[--watch_len] = 0;
    snprintf(shadow, sizeof shadow, "%s", s);
    char blobs[PATH_MAX];
    snprintf(blobs, sizeof blobs, "%s/blobs", shadow);
    mkdir(shadow, 0755);
    mkdir(blobs, 0755);
    enabled = 1;
    /* What the directory holds as the process starts is what its disk held (after a power loss,
     * what tests/faults/powerloss.py rebuilt): all of it durable. */
    pthread_mutex_lock(&sync_lock);
    snapshot_names(1);
    commit_names(1);
    pthread_mutex_unlock(&sync_lock);
}

static int under_watch(const char *path) {
    return strncmp(path, watch, watch_len) == 0 && (path[watch_len] == '/' || !path[watch_len]);
}

static int fd_path(int fd, char *out, size_t n) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, out, n - 1);
    if (len < 0) return -1;
    out[len] = 0;
    return 0;
}

static void make_key(const struct statx *st, char *key, size_t n) {
    unsigned long long sec = 0, nsec = 0;
    if (st->stx_mask & STATX_BTIME) {
        sec = (unsigned long long)st->stx_btime.tv_sec;
        nsec = st->stx_btime.tv_nsec;
    }
    snprintf(key, n, "%llx-%llx-%llx", (unsigned long long)st->stx_ino, sec, nsec);
}

static int stat_key(int dirfd, const char *path, int flags, struct statx *st, char *key) {
    if (statx(dirfd, path, flags, STATX_TYPE | STATX_INO | STATX_SIZE | STATX_BTIME, st)) return -1;
    make_key(st, key, 64);
    return 0;
}

/* ---------------------------------------------------------------- the synced bytes of a file */
struct pending_data {
    char key[64];
    char *buf;
    size_t len;
    off_t at; /* where in the file the bytes go */
    off_t size; /* the file's size, -1 to leave the blob's length alone (msync) */
};

static int read_file(int fd, struct pending_data *p, off_t size) {
    p->buf = size ? malloc((size_t)size) : NULL;
    if (size && !p->buf) return -1;
    size_t got = 0;
    while (got < (size_t)size) {
        ssize_t n = pread(fd, p->buf + got, (size_t)size - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    p->len = got;
    p->at = 0;
    p->size = size;
    return 0;
}

static void write_blob(const struct pending_data *p) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/blobs/%s", shadow, p->key);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    size_t done = 0;
    while (done < p->len) {
        ssize_t n = pwrite(fd, p->buf + done, p->len - done, p->at + (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += (size_t)n;
    }
    if (p->size >= 0 && ftruncate(fd, p->size)) { /* the size comes from the namespace anyway */
    }
    close(fd);
}

/* ---------------------------------------------------------------- names and sizes */
/* Walks the watched tree into namespace.tmp; with `copy_all` (sync, syncfs) it also copies every
 * file's bytes into its blob at once, the caller's real sync having not begun yet. */
static void walk(FILE *out, const char *abs, const char *rel, int copy_all) {
    DIR *d = opendir(abs);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char child[PATH_MAX], child_rel[PATH_MAX], key[64];
        snprintf(child, sizeof child, "%s/%s", abs, e->d_name);
        snprintf(child_rel, sizeof child_rel, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
        struct statx st;
        if (stat_key(AT_FDCWD, child, AT_SYMLINK_NOFOLLOW, &st, key)) continue;
        if (S_ISDIR(st.stx_mode)) {
            fprintf(out, "d\t%s\n", child_rel);
            walk(out, child, child_rel, copy_all);
        } else if (S_ISREG(st.stx_mode)) {
            fprintf(out, "f\t%s\t%llu\t%s\n", key, (unsigned long long)st.stx_size, child_rel);
            if (copy_all) {
                int fd = open(child, O_RDONLY | O_CLOEXEC);
                if (fd < 0) continue;
                struct pending_data p;
                memcpy(p.key, key, sizeof p.key);
                if (!read_file(fd, &p, (off_t)st.stx_size)) {
                    write_blob(&p);
                    free(p.buf);
                }
                close(fd);
            }
        }
    }
    closedir(d);
}

static int snapshot_names(int copy_all) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/namespace.tmp", shadow);
    FILE *out = fopen(tmp, "we");
    if (!out) return -1;
    walk(out, watch, "", copy_all);
    return fclose(out);
}

static void commit_names(int ok) {
    char tmp[PATH_MAX], path[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/namespace.tmp", shadow);
    snprintf(path, sizeof path, "%s/namespace", shadow);
    if (ok)
        rename(tmp, path);
    else
        unlink(tmp);
}

/* ---------------------------------------------------------------- the intercepted calls */
static int sync_fd(int fd, int (*real)(int)) {
    resolve();
    char path[PATH_MAX];
    if (!enabled || fd_path(fd, path, sizeof path) || !under_watch(path)) return real(fd);
    pthread_mutex_lock(&sync_lock);
    struct pending_data p = {.buf = NULL};
    struct statx st;
    int has_data = 0;
    if (!stat_key(fd, "", AT_EMPTY_PATH, &st, p.key) && S_ISREG(st.stx_mode)) {
        /* Read through a descriptor of our own: the caller's may be write-only. */
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
        int rfd = open(self, O_RDONLY | O_CLOEXEC);
        if (rfd >= 0) {
            has_data = !read_file(rfd, &p, (off_t)st.stx_size);
            close(rfd);
        }
    }
    snapshot_names(0);
    int rc = real(fd);
    int saved = errno;
    if (rc == 0 && has_data) write_blob(&p);
    commit_names(rc == 0);
    free(p.buf);
    pthread_mutex_unlock(&sync_lock);
    errno = saved;
    return rc;
}

int fsync(int fd) {
    resolve();
    return sync_fd(fd, real_fsync);
}

int fdatasync(int fd) {
    resolve();
    return sync_fd(fd, real_fdatasync);
}

int msync(void *addr, size_t len, int flags) {
    resolve();
    if (!enabled || !(flags & MS_SYNC)) return real_msync(addr, len, flags);
    struct pending_data p = {.buf = NULL};
    int found = 0;
    pthread_mutex_lock(&maps_lock);
    for (int i = 0; i < MAX_MAPS; i++) {
        struct mapping *m = &maps[i];
        if (m->addr && (char *)addr >= m->addr && (char *)addr < m->addr + m->len) {
            size_t start = (size_t)((char *)addr - m->addr);
            size_t n = len < m->len - start ? len : m->len - start;
            memcpy(p.key, m->key, sizeof p.key);
            p.at = m->offset + (off_t)start;
            p.len = n;
            p.size = -1;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&maps_lock);
    if (!found) return real_msync(addr, len, flags);
    pthread_mutex_lock(&sync_lock);
    p.buf = malloc(p.len ? p.len : 1);
    if (p.buf) memcpy(p.buf, addr, p.len);
    snapshot_names(0);
    int rc = real_msync(addr, len, flags);
    int saved = errno;
    if (rc == 0 && p.buf) write_blob(&p);
    commit_names(rc == 0);
    free(p.buf);
    pthread_mutex_unlock(&sync_lock);
    errno = saved;
    return rc;
}

void sync(void) {
    resolve();
    if (!enabled) {
        real_sync();
        return;
    }
    pthread_mutex_lock(&sync_lock);
    snapshot_names(1);
    real_sync();
    commit_names(1);
    pthread_mutex_unlock(&sync_lock);
}

int syncfs(int fd) {
    resolve();
    if (!enabled) return real_syncfs(fd);
    pthread_mutex_lock(&sync_lock);
    snapshot_names(1);
    int rc = real_syncfs(fd);
    int saved = errno;
    commit_names(rc == 0);
    pthread_mutex_unlock(&sync_lock);
    errno = saved;
    return rc;
}

static void track(void *addr, size_t len, int flags, int fd, off_t offset) {
    char path[PATH_MAX], key[64];
    struct statx st;
    if (!enabled || addr == MAP_FAILED || fd < 0 || !(flags & MAP_SHARED)) return;
    if (fd_path(fd, path, sizeof path) || !under_watch(path)) return;
    if (stat_key(fd, "", AT_EMPTY_PATH, &st, key)) return;
    pthread_mutex_lock(&maps_lock);
    for (int i = 0; i < MAX_MAPS; i++) {
        if (!maps[i].addr) {
            maps[i] = (struct mapping){.addr = addr, .len = len, .offset = offset};
            memcpy(maps[i].key, key, sizeof key);
            break;
        }
    }
    pthread_mutex_unlock(&maps_lock);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset) {
    resolve();
    void *r = real_mmap(addr, len, prot, flags, fd, offset);
    track(r, len, flags, fd, offset);
    return r;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t offset) {
    resolve();
    void *r = real_mmap64(addr, len, prot, flags, fd, offset);
    track(r, len, flags, fd, offset);
    return r;
}

int munmap(void *addr, size_t len) {
    resolve();
    if (enabled) {
        pthread_mutex_lock(&maps_lock);
        for (int i = 0; i < MAX_MAPS; i++)
            if (maps[i].addr >= (char *)addr && maps[i].addr < (char *)addr + len)
                maps[i].addr = NULL;
        pthread_mutex_unlock(&maps_lock);
    }
    return real_munmap(addr, len);
}
