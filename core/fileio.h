/* core/fileio.h: the library's one copy of the low-level file helpers that
 * durable files (safetensors, checkpoints) need: write a whole buffer, fsync
 * a path, list a directory, read a whole file, check a directory is
 * writable. Errors name the path and keep errno's text.
 * Must not: know any file format. */
#ifndef BG_CORE_FILEIO_H
#define BG_CORE_FILEIO_H

#include <stddef.h>

#include "brigade/status.h"

/* Test hook: when >= 0, the number of bytes bg__fileio_write_all may still
 * write; a write beyond it fails with ENOSPC (a full disk). Each write
 * decrements it. -1 (the default): off; BRIGADE_FAULT_WRITE_BYTES sets it
 * for the process on the first write. */
extern long long bg__write_fail_after_bytes;

/* rm -rf path (best effort: what cannot be removed stays). */
void bg__fileio_rm_rf(const char *path);

/* Put the complete directory tmpdir in place as final, in one step where the
 * file system allows (an exchange of the two names): a reader sees the old
 * final or the new one, never a mix. The old one is renamed to aside, then
 * removed; the parent is fsync'ed. tmpdir and final are on one file system. */
bg_status_t bg__fileio_replace_dir(const char *tmpdir, const char *final, const char *aside);

/* Write all n bytes of buf to fd (retrying short writes and EINTR). */
bg_status_t bg__fileio_write_all(int fd, const void *buf, size_t n, const char *path);

/* Reserve n bytes of disk for fd from offset 0 (posix_fallocate): a full
 * disk fails now, naming path, instead of a later write or a memory-mapped
 * store faulting. The full-disk test hook above counts these bytes too. */
bg_status_t bg__fileio_reserve(int fd, size_t n, const char *path);

/* fsync a file or (is_dir) a directory by path. A file system that cannot
 * sync directories (EINVAL) is not an error. */
bg_status_t bg__fileio_fsync_path(const char *path, int is_dir);

/* fsync the directory that holds path (after a rename into it). */
bg_status_t bg__fileio_fsync_parent(const char *path);

/* The names of dir's entries that start with prefix and end with suffix
 * ("" matches anything), sorted (strcmp): *names_p, *n_p of them (possibly
 * 0); free with bg__fileio_free_names. */
bg_status_t bg__fileio_list_dir(const char *dir, const char *prefix, const char *suffix, char ***names_p, int *n_p);
void bg__fileio_free_names(char **names, int n);

/* mkdir -p: create dir and its missing parents (several processes may
 * race: an existing directory is fine; an existing non-directory is not). */
bg_status_t bg__fileio_mkdir_p(const char *dir);

/* Read a whole file: *buf_p (malloc'ed, NUL appended) of *size_p bytes.
 * A missing file is BG_ERR_NOT_FOUND. */
bg_status_t bg__fileio_read(const char *path, char **buf_p, size_t *size_p);

/* A directory is writable, or can be created (its nearest existing ancestor
 * is a writable directory); creates nothing. Here with the file helpers so
 * that the executor and the CLI's job share it without calling each other;
 * not public API (libbrigade.so does not export it). */
bg_status_t bg_check_writable_dir(const char *dir);

/* bg_check_writable_dir, and dir can be replaced as a whole
 * (bg__fileio_replace_dir): its parent is writable and every entry's name
 * ends in suffix (nothing of anyone else's would go with it). */
bg_status_t bg_check_replaceable_dir(const char *dir, const char *suffix);

#endif
