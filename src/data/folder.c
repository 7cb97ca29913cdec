/* ImageFolder: DIR/train/CLASS/... and DIR/val/CLASS/... as torchvision's datasets.ImageFolder reads
 * them. Loading only lists the files (names, no pixels): memory stays at one path per image however
 * large the folder, and no file is opened until a batch needs it. */
/* realpath (XSI) */
#define _DEFAULT_SOURCE
#include "data/folder.h"

#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <limits.h>
#include <sys/stat.h>

enum { MAX_DEPTH = 16, MAX_BAD_IN_A_ROW = 64 };

ch_folder_options ch_folder_options_default(void)
{
    return (ch_folder_options){ .image_size = 224 };
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* A growing array of strings. */
typedef struct names {
    char **v;
    size_t n, cap;
} names;

static bool names_push(names *s, const char *text)
{
    if (s->n == s->cap) {
        const size_t cap = s->cap ? 2 * s->cap : 64;
        char **v = realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    if (!(s->v[s->n] = strdup(text))) return false;
    s->n++;
    return true;
}

/* The entries of dir, sorted by name; hidden ones (".x") are left out, as a stray
 * .ipynb_checkpoints folder must not become a class. */
static ch_status list_dir(const char *dir, names *out, ch_err *err)
{
    *out = (names){ 0 };
    DIR *d = opendir(dir);
    if (!d) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: cannot open the folder (%s)", dir, strerror(errno));
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (!names_push(out, e->d_name)) {
            closedir(d);
            free_names(out->v, out->n);
            return CH_SYS_FAIL(err, "allocation of a file list");
        }
    }
    closedir(d);
    if (out->n) qsort(out->v, out->n, sizeof *out->v, by_name);
    return CH_STATUS_OK;
}

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static ch_status join(char *out, size_t len, const char *dir, const char *name, ch_err *err)
{
    if (snprintf(out, len, "%s/%s", dir, name) >= (int)len)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s/%s: path too long", dir, name);
    return CH_STATUS_OK;
}

/* The folders a scan of one split has walked, by (device, inode), so that a link back to a folder
 * (a loop, or a second way into one) neither loops nor counts its images twice. */
typedef struct scan {
    struct { dev_t dev; ino_t ino; } *seen;
    size_t nseen, cap;
    size_t left_out;            /* named like an image, but no regular file: counted, not read */
    char first_left_out[1024];
} scan;

static void scan_free(scan *sc) { free(sc->seen); }

/* A .png, .jpg or .jpeg that is a regular file (through links). One named so that is not (a
 * dangling link, a link loop, a FIFO, a socket, a folder) is left out and counted in sc, with what
 * it is, so the user hears of it. */
static bool is_image_file(scan *sc, const char *path, const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot || (strcasecmp(dot, ".png") && strcasecmp(dot, ".jpg") && strcasecmp(dot, ".jpeg"))) return false;
    struct stat sb;
    const bool there = stat(path, &sb) == 0;
    if (there && S_ISREG(sb.st_mode)) return true;
    const char *what = !there ? (errno == ELOOP ? "a symbolic link loop" : "a dangling symbolic link")
                       : S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISSOCK(sb.st_mode) ? "a socket"
                       : S_ISDIR(sb.st_mode) ? "a folder" : "no regular file";
    if (sc->left_out++ == 0) snprintf(sc->first_left_out, sizeof sc->first_left_out, "%.900s: %s", path, what);
    return false;
}

/* True when path is new to this scan (and now recorded); false when walked already. */
static ch_status first_visit(scan *sc, const char *path, bool *first, ch_err *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %s", path, strerror(errno));
    for (size_t i = 0; i < sc->nseen; i++)
        if (sc->seen[i].dev == sb.st_dev && sc->seen[i].ino == sb.st_ino) {
            *first = false;
            return CH_STATUS_OK;
        }
    if (sc->nseen == sc->cap) {
        const size_t cap = sc->cap ? 2 * sc->cap : 64;
        void *p = realloc(sc->seen, cap * sizeof *sc->seen);
        if (!p) return CH_SYS_FAIL(err, "allocation of the folder list");
        sc->seen = p;
        sc->cap = cap;
    }
    sc->seen[sc->nseen].dev = sb.st_dev;
    sc->seen[sc->nseen].ino = sb.st_ino;
    sc->nseen++;
    *first = true;
    return CH_STATUS_OK;
}

/* A symbolic link must stay inside top (the realpath of the data set's folder for a class folder
 * itself, of the class folder inside it: a class's images come from its own folder). */
static ch_status check_link(const char *top, const char *path, ch_err *err)
{
    struct stat lb;
    if (lstat(path, &lb) != 0 || !S_ISLNK(lb.st_mode)) return CH_STATUS_OK;
    char *real = realpath(path, NULL);
    if (!real) return CH_STATUS_OK;   /* dangling: neither a file nor a folder, left out */
    const size_t n = strlen(top);
    const bool inside = strncmp(real, top, n) == 0 && (real[n] == '/' || real[n] == 0);
    ch_status st = inside ? CH_STATUS_OK
                          : ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a symbolic link to %s, outside %s (a class's "
                                    "images must come from its own folder)", path, real, top);
    free(real);
    return st;
}

/* The images under dir: its own files by name, then its folders in name order (as torchvision's
 * sorted walk, to within the order of nested folders). */
static ch_status walk(scan *sc, const char *top, const char *dir, int depth, names *files, ch_err *err)
{
    bool first = false;
    CH_TRY(first_visit(sc, dir, &first, err));
    if (!first) return CH_STATUS_OK;
    names entries;
    CH_TRY(list_dir(dir, &entries, err));
    ch_status st = CH_STATUS_OK;
    char path[4096];
    for (int pass = 0; pass < 2 && st == CH_STATUS_OK; pass++)
        for (size_t i = 0; i < entries.n && st == CH_STATUS_OK; i++) {
            st = join(path, sizeof path, dir, entries.v[i], err);
            if (st == CH_STATUS_OK) st = check_link(top, path, err);
            if (st != CH_STATUS_OK) break;
            if (pass == 0 && is_image_file(sc, path, entries.v[i]) && !names_push(files, path))
                st = CH_SYS_FAIL(err, "allocation of a file list");
            else if (pass == 1 && depth < MAX_DEPTH && is_dir(path))
                st = walk(sc, top, path, depth + 1, files, err);
        }
    free_names(entries.v, entries.n);
    return st;
}

/* The class folders of DIR/train, sorted: the classes of both splits. */
static ch_status class_names(const char *train, names *out, ch_err *err)
{
    names all;
    CH_TRY(list_dir(train, &all, err));
    *out = (names){ 0 };
    char path[4096];
    ch_status st = CH_STATUS_OK;
    for (size_t i = 0; i < all.n && st == CH_STATUS_OK; i++) {
        st = join(path, sizeof path, train, all.v[i], err);
        if (st == CH_STATUS_OK && is_dir(path) && !names_push(out, all.v[i]))
            st = CH_SYS_FAIL(err, "allocation of a class list");
    }
    free_names(all.v, all.n);
    if (st == CH_STATUS_OK && out->n < 2)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %zu class folder%s; an ImageFolder needs one folder per "
                     "class and at least 2", train, out->n, out->n == 1 ? "" : "s");
    if (st == CH_STATUS_OK && out->n > CH_MAX_CLASSES)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %zu classes, at most %d", train, out->n, CH_MAX_CLASSES);
    if (st != CH_STATUS_OK) free_names(out->v, out->n);
    return st;
}

bool ch_folder_present(const char *dir)
{
    char train[4096];
    return snprintf(train, sizeof train, "%s/train", dir) < (int)sizeof train && is_dir(train);
}

/* The files of every class folder of root (the split), labelled by the train split's classes. */
static ch_status scan_split(scan *sc, const char *top, const char *root, const names *classes, names *files, uint16_t **labels,
                            ch_err *err)
{
    names split;
    CH_TRY(list_dir(root, &split, err));
    *files = (names){ 0 };
    *labels = NULL;
    size_t cap = 0;
    char path[4096];
    ch_status st = CH_STATUS_OK;
    for (size_t i = 0; i < split.n && st == CH_STATUS_OK; i++) {
        st = join(path, sizeof path, root, split.v[i], err);
        if (st == CH_STATUS_OK) st = check_link(top, path, err);
        if (st != CH_STATUS_OK || !is_dir(path)) continue;
        char class_top[PATH_MAX];
        if (!realpath(path, class_top)) {
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %s", path, strerror(errno));
            break;
        }
        char **hit = bsearch(&split.v[i], classes->v, classes->n, sizeof *classes->v, by_name);
        if (!hit) {
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a class the training folder does not have", path);
            break;
        }
        const size_t before = files->n;
        st = walk(sc, class_top, path, 1, files, err);
        if (st == CH_STATUS_OK && files->n == before)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: an empty class folder (no .png, .jpg or .jpeg files)", path);
        if (st == CH_STATUS_OK && files->n > cap) {
            cap = files->cap;
            uint16_t *l = realloc(*labels, (cap ? cap : 1) * sizeof *l);
            if (!l) st = CH_SYS_FAIL(err, "allocation of labels");
            else *labels = l;
        }
        for (size_t k = before; st == CH_STATUS_OK && k < files->n; k++) (*labels)[k] = (uint16_t)(hit - classes->v);
    }
    free_names(split.v, split.n);
    if (st == CH_STATUS_OK && files->n == 0)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no images (expected CLASS/*.png, *.jpg or *.jpeg)", root);
    if (st == CH_STATUS_OK && files->n > UINT32_MAX)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %zu images, at most %u", root, files->n, UINT32_MAX);
    if (st != CH_STATUS_OK) {
        free_names(files->v, files->n);
        free(*labels);
        *labels = NULL;
    }
    return st;
}

ch_status ch_dataset_load_folder(const char *dir, ch_split split, const ch_folder_options *o,
                                 ch_dataset **out, ch_err *err)
{
    const ch_folder_options def = ch_folder_options_default();
    if (!o) o = &def;
    if (o->image_size < 8 || o->image_size > 4096)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "image size %d: expected 8..4096", o->image_size);
    char train[4096], root[4096];
    snprintf(train, sizeof train, "%s/train", dir);
    if (snprintf(root, sizeof root, "%s/%s", dir, split == CH_SPLIT_TRAIN ? "train" : "val") >= (int)sizeof root)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: path too long", dir);
    if (!is_dir(train) || !is_dir(root))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no such folder (an ImageFolder is DIR/train/CLASS/... "
                       "and DIR/val/CLASS/...)", is_dir(train) ? root : train);
    names classes, files;
    uint16_t *labels = NULL;
    scan sc = { .seen = NULL };
    char top[PATH_MAX];
    if (!realpath(dir, top)) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %s", dir, strerror(errno));
    CH_TRY(class_names(train, &classes, err));
    ch_status st = scan_split(&sc, top, root, &classes, &files, &labels, err);
    scan_free(&sc);
    if (st != CH_STATUS_OK) {
        free_names(classes.v, classes.n);
        return st;
    }
    ch_dataset *d = calloc(1, sizeof *d);
    ch_folder *f = calloc(1, sizeof *f);
    char *root_copy = strdup(root);
    atomic_uchar *bad = calloc(files.n, sizeof *bad);
    if (!d || !f || !root_copy || !bad) {
        free(d);
        free(f);
        free(bad);
        free(root_copy);
        free_names(classes.v, classes.n);
        free_names(files.v, files.n);
        free(labels);
        return CH_SYS_FAIL(err, "allocation of a data set");
    }
    *f = (ch_folder){ .root = root_copy, .paths = files.v, .npaths = files.n, .class_names = classes.v,
                      .nclasses = (int)classes.n, .image_size = o->image_size, .skip_bad = o->skip_bad_images, .bad = bad,
                      .left_out = sc.left_out };
    memcpy(f->first_left_out, sc.first_left_out, sizeof f->first_left_out);
    atomic_init(&f->skipped, 0);
    atomic_flag_clear(&f->first_taken);
    *d = (ch_dataset){ .n = files.n, .c = 3, .h = o->image_size, .w = o->image_size,
                       .classes = (int)classes.n, .labels = labels, .folder = f };
    *out = d;
    return CH_STATUS_OK;
}

static ch_status decode_file(const char *path, ch_image *img, ch_err *err)
{
    uint8_t *data;
    size_t len;
    CH_TRY(ch_file_read(path, CH_FOLDER_MAX_FILE_BYTES, &data, &len, err));
    ch_status st = ch_image_decode(data, len, path, CH_IMAGE_MAX_PIXELS, img, err);
    free(data);
    return st;
}

ch_status ch_folder_decode(const ch_dataset *d, uint32_t i, ch_image *img, int *label, ch_err *err)
{
    ch_folder *f = d->folder;
    ch_err bad;
    for (uint32_t k = 0; k < MAX_BAD_IN_A_ROW && k < d->n; k++) {
        const uint32_t j = (uint32_t)(((uint64_t)i + k) % d->n);
        const ch_status st = decode_file(f->paths[j], img, &bad);
        if (st == CH_STATUS_OK) {
            *label = d->labels[j];
            return CH_STATUS_OK;
        }
        if (!f->skip_bad || st != CH_STATUS_BAD_INPUT) {
            *err = bad;
            return st;
        }
        if (!atomic_exchange(&f->bad[j], 1)) {
            atomic_fetch_add(&f->skipped, 1);
            if (!atomic_flag_test_and_set(&f->first_taken)) snprintf(f->first_bad, sizeof f->first_bad, "%s", bad.msg);
        }
    }
    return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: this and the next %d images did not decode (the last: %s)",
                   f->paths[i], MAX_BAD_IN_A_ROW - 1, bad.msg);
}

size_t ch_dataset_left_out(const ch_dataset *d, char *first, size_t len)
{
    if (!d || !d->folder || !d->folder->left_out) return 0;
    snprintf(first, len, "%s", d->folder->first_left_out);
    return d->folder->left_out;
}

size_t ch_dataset_skipped(const ch_dataset *d, char *first, size_t len)
{
    if (!d || !d->folder) return 0;
    const size_t n = atomic_load(&d->folder->skipped);
    if (first && len) snprintf(first, len, "%s", n ? d->folder->first_bad : "");
    return n;
}

void ch_folder_free(ch_folder *f)
{
    if (!f) return;
    free_names(f->paths, f->npaths);
    free_names(f->class_names, (size_t)f->nclasses);
    free(f->root);
    free(f->bad);
    free(f);
}
