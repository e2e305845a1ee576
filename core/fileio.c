/* core/fileio.c: write-all, fsync by path, mkdir -p, directory listings, whole-file reads and the
 * check that a directory can be written before a run (see core/fileio.h). Owns the full-disk test hook so that every durable write
 * of the library can be made to fail the same way. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* renameat2 */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "brigade/core.h"
#include "core/check.h"
#include "core/fileio.h"

long long bg__write_fail_after_bytes = -1;

/* BRIGADE_FAULT_WRITE_BYTES arms the full-disk hook for a whole process (a
 * multi-process test arms it in one rank); an in-process test's own setting
 * of the variable wins. */
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static void fault_init(void)
{
    const char *s = bg_config_str("BRIGADE_FAULT_WRITE_BYTES");
    char *end;
    long long n = s && *s ? strtoll(s, &end, 10) : -1;
    if (bg__write_fail_after_bytes < 0 && n >= 0 && !*end)
        bg__write_fail_after_bytes = n;
}

bg_status_t bg__fileio_write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    pthread_once(&fault_once, fault_init);
    while (n) {
        size_t k = n;
        ssize_t w;
        if (bg__write_fail_after_bytes >= 0 && (long long)k > bg__write_fail_after_bytes)
            k = (size_t)bg__write_fail_after_bytes;
        if (k == 0) {
            errno = ENOSPC;
            w = -1;
        } else {
            w = write(fd, p, k);
        }
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return bg_error(BG_ERR_IO, "writing %s: %s", path, strerror(errno));
        }
        if (bg__write_fail_after_bytes >= 0)
            bg__write_fail_after_bytes -= w;
        p += w;
        n -= (size_t)w;
    }
    return BG_OK;
}

bg_status_t bg__fileio_reserve(int fd, size_t n, const char *path)
{
    pthread_once(&fault_once, fault_init);
    int rc = bg__write_fail_after_bytes >= 0 && (long long)n > bg__write_fail_after_bytes ? ENOSPC
                                                                                          : posix_fallocate(fd, 0, (off_t)n);
    if (rc != 0)
        return bg_error(BG_ERR_IO, "cannot reserve %zu bytes for %s: %s", n, path, strerror(rc));
    if (bg__write_fail_after_bytes >= 0)
        bg__write_fail_after_bytes -= (long long)n;
    return BG_OK;
}

bg_status_t bg__fileio_fsync_path(const char *path, int is_dir)
{
    int fd = open(path, (is_dir ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bg_error(BG_ERR_IO, "cannot open %s to sync it: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) /* some file systems cannot sync directories */
        return bg_error(BG_ERR_IO, "fsync %s: %s", path, strerror(e));
    return BG_OK;
}

bg_status_t bg__fileio_fsync_parent(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return bg_error(BG_ERR_NOMEM, "cannot copy the path %s", path);
    bg_status_t st = bg__fileio_fsync_path(dirname(copy), 1);
    free(copy);
    return st;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void bg__fileio_rm_rf(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

bg_status_t bg__fileio_replace_dir(const char *tmpdir, const char *final, const char *aside)
{
    struct stat sb;
    if (lstat(final, &sb) != 0) {
        if (rename(tmpdir, final) != 0)
            return bg_error(BG_ERR_IO, "cannot rename %s to %s: %s", tmpdir, final, strerror(errno));
    } else if (renameat2(AT_FDCWD, tmpdir, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        if (rename(tmpdir, aside) != 0) /* tmpdir holds the old one now */
            bg__fileio_rm_rf(tmpdir);
    } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
        /* no atomic exchange here: a moment with neither, never a mix */
        if (rename(final, aside) != 0)
            return bg_error(BG_ERR_IO, "cannot move the existing %s aside: %s", final, strerror(errno));
        if (rename(tmpdir, final) != 0) {
            bg_status_t st = bg_error(BG_ERR_IO, "cannot rename %s to %s: %s", tmpdir, final, strerror(errno));
            rename(aside, final);
            return st;
        }
    } else {
        return bg_error(BG_ERR_IO, "cannot replace %s by %s: %s", final, tmpdir, strerror(errno));
    }
    BG_CHECK(bg__fileio_fsync_parent(final));
    bg__fileio_rm_rf(aside);
    return BG_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void bg__fileio_free_names(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

bg_status_t bg__fileio_list_dir(const char *dir, const char *prefix, const char *suffix, char ***names_p, int *n_p)
{
    DIR *d = opendir(dir);
    if (!d)
        return bg_error(BG_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    size_t P = strlen(prefix), S = strlen(suffix);
    bg_status_t st = BG_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (L < P + S || strncmp(de->d_name, prefix, P) != 0 || strcmp(de->d_name + L - S, suffix) != 0 ||
            !strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **q = realloc(names, (size_t)cap * sizeof(*q));
            if (!q) {
                st = bg_error(BG_ERR_NOMEM, "file list of %s", dir);
                break;
            }
            names = q;
        }
        if (!(names[n] = strdup(de->d_name))) {
            st = bg_error(BG_ERR_NOMEM, "file list of %s", dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (st != BG_OK) {
        bg__fileio_free_names(names, n);
        return st;
    }
    if (n)
        qsort(names, (size_t)n, sizeof(*names), cmp_str);
    *names_p = names;
    *n_p = n;
    return BG_OK;
}

bg_status_t bg__fileio_read(const char *path, char **buf_p, size_t *size_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bg_error(errno == ENOENT ? BG_ERR_NOT_FOUND : BG_ERR_IO, "cannot open %s: %s", path,
                        strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return bg_error(BG_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return bg_error(BG_ERR_IO, "cannot read %s: it is a directory", path);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return bg_error(BG_ERR_NOMEM, "cannot allocate %zu bytes to read %s", n + 1, path);
    }
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return bg_error(BG_ERR_IO, "reading %s: %s", path, k < 0 ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)k;
    }
    close(fd);
    buf[n] = 0;
    *buf_p = buf;
    *size_p = n;
    return BG_OK;
}

bg_status_t bg__fileio_mkdir_p(const char *dir)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
        return bg_error(BG_ERR_INVALID, "path too long: %s", dir);
    for (char *s = tmp + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            struct stat sb;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return bg_error(BG_ERR_IO, "cannot create directory %s: %s", tmp, strerror(errno));
            if (stat(tmp, &sb) != 0)
                return bg_error(BG_ERR_IO, "cannot use %s as a directory: %s", tmp, strerror(errno));
            if (!S_ISDIR(sb.st_mode))
                return bg_error(BG_ERR_IO, "cannot use %s as a directory: it is not one", tmp);
            *s = c;
            if (!c)
                break;
        }
    }
    return BG_OK;
}

/* The file bg_check_writable_dir creates and removes at once (its name, then the pid): the ranks of a
 * job check one --save directory at the same time, so bg_check_replaceable_dir passes over such files. */
#define BG__WRITE_PROBE ".brigade-write-probe."

bg_status_t bg_check_writable_dir(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return bg_error(BG_ERR_IO, "%s exists and is not a directory", dir);
        char probe[4096];
        snprintf(probe, sizeof(probe), "%s/" BG__WRITE_PROBE "%d", dir, (int)getpid());
        FILE *f = fopen(probe, "wb");
        if (!f)
            return bg_error(BG_ERR_IO, "directory %s is not writable: %s", dir, strerror(errno));
        fclose(f);
        unlink(probe);
        return BG_OK;
    }
    if (errno != ENOENT)
        return bg_error(BG_ERR_IO, "cannot use directory %s: %s", dir, strerror(errno));
    /* missing: it will be created (when there is something to put in it)
     * under its nearest existing ancestor, which must be a writable directory */
    char up[4096];
    if (snprintf(up, sizeof(up), "%s", dir) >= (int)sizeof(up))
        return bg_error(BG_ERR_INVALID, "path too long: %s", dir);
    for (;;) {
        size_t n = strlen(up);
        while (n > 1 && up[n - 1] == '/')
            up[--n] = 0;
        char *slash = strrchr(up, '/');
        if (!slash)
            snprintf(up, sizeof(up), ".");
        else if (slash == up)
            up[1] = 0;
        else
            *slash = 0;
        if (stat(up, &st) == 0)
            break;
        if (errno != ENOENT || !strcmp(up, ".") || !strcmp(up, "/"))
            return bg_error(BG_ERR_IO, "cannot create directory %s: %s: %s", dir, up, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return bg_error(BG_ERR_IO, "cannot create directory %s: %s is not a directory", dir, up);
    if (access(up, W_OK | X_OK) != 0)
        return bg_error(BG_ERR_IO, "cannot create directory %s: %s is not writable: %s", dir, up, strerror(errno));
    return BG_OK;
}

bg_status_t bg_check_replaceable_dir(const char *dir, const char *suffix)
{
    BG_CHECK(bg_check_writable_dir(dir));
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return BG_OK; /* to be made: its ancestor is writable */
    char *copy = strdup(dir);
    if (!copy)
        return bg_error(BG_ERR_NOMEM, "cannot copy the path %s", dir);
    bg_status_t st = bg_check_writable_dir(dirname(copy));
    free(copy);
    if (st != BG_OK)
        return bg_error(st, "%s cannot be replaced: %s", dir, bg_last_error());
    char **names;
    int n;
    BG_CHECK(bg__fileio_list_dir(dir, "", "", &names, &n));
    for (int i = 0; i < n && st == BG_OK; i++) {
        size_t k = strlen(names[i]), m = strlen(suffix);
        if (k > m && strcmp(names[i] + k - m, suffix) == 0)
            continue;
        if (strncmp(names[i], BG__WRITE_PROBE, strlen(BG__WRITE_PROBE)) == 0)
            continue; /* another rank's bg_check_writable_dir, there for an instant */
        st = bg_error(BG_ERR_INVALID, "%s holds %s, which is not a *%s file: the directory is replaced as a whole "
                      "(a reader never sees half of a save), so give it a directory of its own",
                      dir, names[i], suffix);
    }
    bg__fileio_free_names(names, n);
    return st;
}
