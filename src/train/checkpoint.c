/* Checkpoint directories: what goes in them, how they are written atomically, how they are read
 * back and checked, and how old ones are pruned (see checkpoint.h). */
#include "train/checkpoint.h"

#include "core/file.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph/graph.h"
#include "graph/graph_json.h"
#include "io/json.h"
#include "models/zoo.h"
#include "train/options.h"
#include "train/position.h"
#include "io/safetensors.h"

/* ---- files -------------------------------------------------------------------------------- */

#define MARK CH_CHECKPOINT_MARK

/* out <- a/b. The entry points refuse directories longer than PATH_MAX - 512, so this never
 * truncates. */
static void join(char *out, size_t len, const char *a, const char *b)
{
    const int n = snprintf(out, len, "%s/%s", a, b);
    CH_ASSERT(n >= 0 && (size_t)n < len);
}

static ch_status check_length(const char *path, ch_err *err)
{
    if (strlen(path) > PATH_MAX - 512)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%.80s...: path too long", path);
    return CH_STATUS_OK;
}

/* The file at path as a string, or NULL (err filled) if it cannot be read or is over max bytes. */
static char *read_text(const char *path, size_t max, ch_err *err)
{
    uint8_t *data = NULL;
    size_t len = 0;
    return ch_file_read(path, max, &data, &len, err) == CH_STATUS_OK ? (char *)data : NULL;
}

/* COHORT_INJECT_CKPT_CRASH=STAGE: the process kills itself (SIGKILL) right after STAGE of a save
 * (model, optimizer, trainer, rename, latest), for the test that a crash never loses a checkpoint. */
static void crash_point(const char *stage)
{
    const char *s = getenv("COHORT_INJECT_CKPT_CRASH");
    if (s && strcmp(s, stage) == 0) raise(SIGKILL);
}

/* ---- what is saved ------------------------------------------------------------------------ */

static void shape_of(const ch_tensor_ref *r, ch_st_tensor *t)
{
    t->ndim = r->spec ? r->spec->ndim : 0;
    for (int i = 0; i < t->ndim; i++) t->shape[i] = r->spec->dims[i];
}

/* The state_dict as float32 (params, buffers) and int64 (num_batches_tracked); vals is filled with
 * the float copies and must hold nparams + nbuffers floats. -1 (and err) when they cannot be had. */
static int model_tensors(const ch_model *m, ch_st_tensor *out, float *vals, ch_err *err)
{
    const size_t P = m->nparams;
    if (ch_model_download_floats_async(m, vals, m->params, P, err) != CH_STATUS_OK ||
        ch_model_download_floats_async(m, vals + P, m->buffers, m->nbuffers, err) != CH_STATUS_OK)
        return -1;
    ch_backend_sync(m->be, CH_STREAM_COMPUTE);   /* both copies written before the file is */
    for (int k = 0; k < m->ntensors; k++) {
        const ch_tensor_ref *r = &m->tensors[k];
        ch_st_tensor *t = &out[k];
        *t = (ch_st_tensor){ 0 };
        snprintf(t->name, sizeof t->name, "%s", r->name);
        shape_of(r, t);
        if (r->kind == CH_TENSOR_COUNTER) {
            t->dtype = CH_ST_I64;
            t->data = r->counter;
            t->nbytes = sizeof(int64_t);
        } else {
            const size_t base = r->kind == CH_TENSOR_PARAM ? 0 : P;
            t->dtype = CH_ST_F32;
            t->data = vals + base + r->spec->offset;
            t->nbytes = sizeof(float) * r->spec->count;
        }
    }
    return m->ntensors;
}

/* Every state buffer of the optimizer per parameter ("0.weight.exp_avg", ...); vals holds
 * nstate x nparams floats. */
static int optimizer_tensors(const ch_model *m, const ch_optim *o, ch_st_tensor *out, float *vals,
                             ch_err *err)
{
    int n = 0;
    for (int s = 0; s < o->nstate; s++) {
        float *v = vals + (size_t)s * m->nparams;
        if (ch_model_download_floats_async(m, v, o->state[s], m->nparams, err) != CH_STATUS_OK) return -1;
        for (int k = 0; k < m->ntensors; k++) {
            const ch_tensor_ref *r = &m->tensors[k];
            if (r->kind != CH_TENSOR_PARAM) continue;
            ch_st_tensor *t = &out[n++];
            *t = (ch_st_tensor){ .dtype = CH_ST_F32, .data = v + r->spec->offset,
                                 .nbytes = sizeof(float) * r->spec->count };
            snprintf(t->name, sizeof t->name, "%s.%s", r->name, ch_optim_state_name(o, s));
            shape_of(r, t);
        }
    }
    ch_backend_sync(m->be, CH_STREAM_COMPUTE);   /* every state's copy written before the file is */
    return n;
}

static char *trainer_json(const ch_ckpt_run *run, const ch_ckpt_position *p)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    const ch_model *m = run->model;
    cJSON_AddNumberToObject(j, "format_version", CH_CHECKPOINT_FORMAT);
    cJSON_AddStringToObject(j, "written_by", "cohort " CH_VERSION);
    cJSON_AddStringToObject(j, "model", run->model_name);
    const double in[3] = { m->input.c, m->input.h, m->input.w };
    cJSON_AddItemToObject(j, "input", cJSON_CreateDoubleArray(in, 3));
    cJSON_AddNumberToObject(j, "classes", m->classes);
    /* The option table's recorded rows, as the run uses them: the optimizer's defaults filled in,
     * the initialisation and the inputs' normalisation as resolved (evaluation must see the inputs
     * the way training saw them). */
    ch_train_config used = *run->cfg;
    used.weight_decay = run->optim->weight_decay;
    used.dampening = run->optim->dampening;
    used.beta1 = run->optim->beta1;
    used.beta2 = run->optim->beta2;
    used.eps = run->optim->eps;
    used.init = run->init;
    used.normalize = run->normalize[0] ? run->normalize : NULL;
    ch_opt_record_config(&used, cJSON_AddObjectToObject(j, "config"));
    cJSON_AddNumberToObject(j, "seed", (double)run->cfg->seed);
    cJSON_AddNumberToObject(j, "epoch", p->epoch);
    cJSON_AddNumberToObject(j, "step_in_epoch", p->step_in_epoch);
    cJSON_AddNumberToObject(j, "global_step", (double)p->global_step);
    cJSON_AddStringToObject(j, "optimizer", ch_optim_kind_name(run->optim->kind));
    cJSON_AddNumberToObject(j, "optimizer_steps", (double)run->opt->steps);
    /* The epoch order and every random stream are Philox keyed by (seed, stream, counter); the
     * counters derive from the epoch and global step, so this is the whole RNG state. */
    cJSON *rng = cJSON_AddObjectToObject(j, "rng");
    cJSON_AddStringToObject(rng, "generator", "philox4x32-10");
    cJSON_AddNumberToObject(rng, "seed", (double)run->cfg->seed);
    cJSON_AddStringToObject(rng, "keys", "shuffle: (seed, epoch); dropout: (seed, layer, global_step, sample)");
    cJSON *order = cJSON_AddObjectToObject(j, "data_order");
    cJSON_AddNumberToObject(order, "epoch", p->epoch);
    cJSON_AddNumberToObject(order, "samples_seen", (double)p->seen_in_epoch);
    cJSON_AddNumberToObject(order, "train_samples", (double)run->train_samples);
    cJSON_AddItemToObject(order, "loss_sum", ch_position_metric_item(p->loss_sum));
    cJSON_AddNumberToObject(order, "correct", p->hits);
    cJSON *sched = cJSON_AddObjectToObject(j, "schedule");
    cJSON_AddStringToObject(sched, "kind", ch_schedule_kind_name(run->sched->kind));
    cJSON_AddNumberToObject(sched, "base_lr", run->sched->lr);
    cJSON_AddNumberToObject(sched, "warmup_epochs", run->sched->warmup_epochs);
    cJSON_AddNumberToObject(sched, "epoch", p->epoch);
    cJSON_AddNumberToObject(sched, "step_in_epoch", p->step_in_epoch);
    cJSON_AddNumberToObject(sched, "position", (double)p->global_step);
    cJSON *last = cJSON_AddObjectToObject(j, "last_epoch");
    cJSON_AddItemToObject(last, "train_loss", ch_position_metric_item(p->train_loss));
    cJSON_AddNumberToObject(last, "train_acc", p->train_acc);
    cJSON_AddItemToObject(last, "test_loss", ch_position_metric_item(p->test_loss));
    cJSON_AddNumberToObject(last, "test_acc", p->test_acc);
    cJSON_AddNumberToObject(j, "world_size", run->world_size);
    if (run->shares) {   /* a record: a resumed run takes the shares it is given */
        cJSON *sh = cJSON_AddArrayToObject(j, "shares");
        for (int r = 0; r < run->world_size; r++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)run->shares[r]));
    }
    cJSON *devs = cJSON_AddArrayToObject(j, "devices");
    for (int i = 0; i < run->devices->count; i++) {
        char d[32];
        ch_device_name(&run->devices->dev[i], d, sizeof d);
        cJSON_AddItemToArray(devs, cJSON_CreateString(d));
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}

/* ---- saving ------------------------------------------------------------------------------- */

static ch_status write_model_files(const ch_ckpt_run *run, const char *tmp, ch_err *err)
{
    const ch_model *m = run->model;
    const size_t nvals = m->nparams * CH_OPTIM_MAX_STATE + m->nbuffers + 1;
    ch_st_tensor *ts = calloc((size_t)m->ntensors * CH_OPTIM_MAX_STATE + 1, sizeof *ts);
    float *vals = malloc(sizeof(float) * nvals);
    ch_status st = ts && vals ? CH_STATUS_OK : CH_SYS_FAIL(err, "allocation of checkpoint buffers");
    char path[PATH_MAX];
    static const char *const meta[][2] = { { "format", "pt" }, { "writer", "cohort " CH_VERSION } };
    if (st == CH_STATUS_OK) {
        const int n = model_tensors(m, ts, vals, err);
        join(path, sizeof path, tmp, "model.safetensors");
        st = n < 0 ? CH_STATUS_SYSTEM : ch_st_write(path, ts, n, meta, 2, err);
    }
    crash_point("model");
    if (st == CH_STATUS_OK) {
        const int n = optimizer_tensors(m, run->opt, ts, vals, err);
        join(path, sizeof path, tmp, "optimizer.safetensors");
        st = n < 0 ? CH_STATUS_SYSTEM : ch_st_write(path, ts, n, meta, 2, err);
    }
    crash_point("optimizer");
    free(ts);
    free(vals);
    return st;
}

static ch_status write_into(const ch_ckpt_run *run, const char *tmp, const ch_ckpt_position *p, ch_err *err)
{
    CH_TRY(write_model_files(run, tmp, err));
    char path[PATH_MAX];
    /* A graph model's description: eval, export and --resume need no original file. */
    if (run->graph_json) {
        join(path, sizeof path, tmp, "graph.json");
        CH_TRY(ch_file_write_text(path, run->graph_json, err));
    }
    char *text = trainer_json(run, p);
    if (!text) return CH_SYS_FAIL(err, "building trainer.json");
    join(path, sizeof path, tmp, "trainer.json");
    ch_status st = ch_file_write_text(path, text, err);
    free(text);
    crash_point("trainer");
    if (st == CH_STATUS_OK) st = ch_file_sync_path(tmp, err);
    return st;
}

/* DIR/latest -> name: a symbolic link to the entry, so that DIR/latest/model.safetensors is a path
 * any program can open. Made under a temporary name and renamed over the old one (rename replaces
 * atomically), then the folder synced: the link lives in the folder's own data. */
static ch_status point_latest(const char *dir, const char *name, ch_err *err)
{
    char tmp[PATH_MAX], dst[PATH_MAX];
    CH_ASSERT(snprintf(tmp, sizeof tmp, "%s/" MARK "latest.%ld", dir, (long)getpid()) < (int)sizeof tmp);
    join(dst, sizeof dst, dir, "latest");
    if (unlink(tmp) != 0 && errno != ENOENT)
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: cannot remove (%s)", tmp, strerror(errno));
    if (symlink(name, tmp) != 0)
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: cannot make a symbolic link (%s)", tmp, strerror(errno));
    if (rename(tmp, dst) != 0)
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: rename failed (%s)", dst, strerror(errno));
    return ch_file_sync_path(dir, err);
}

static uint64_t step_of(const char *dir, const char *name)
{
    char path[PATH_MAX];
    CH_ASSERT(snprintf(path, sizeof path, "%s/%s/trainer.json", dir, name) < (int)sizeof path);
    char *text = read_text(path, 1 << 20, NULL);
    if (!text) return UINT64_MAX;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "global_step");
    const uint64_t v = cJSON_IsNumber(s) ? (uint64_t)s->valuedouble : UINT64_MAX;
    cJSON_Delete(j);
    return v;
}

typedef struct entry { char name[256]; uint64_t step; } entry;

static int by_step(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return (x->step > y->step) - (x->step < y->step);
}

/* Keep the newest `keep` checkpoints (by global step); never the one just written. */
static void prune(const char *dir, int keep, const char *current)
{
    if (keep <= 0) return;
    DIR *d = opendir(dir);
    if (!d) return;
    entry *list = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "epoch-", 6) != 0 && strncmp(e->d_name, "step-", 5) != 0) continue;
        if (n == cap) {
            entry *grown = realloc(list, sizeof *list * (size_t)(cap = cap ? 2 * cap : 16));
            if (!grown) break;
            list = grown;
        }
        snprintf(list[n].name, sizeof list[n].name, "%s", e->d_name);
        list[n].step = step_of(dir, e->d_name);
        n++;
    }
    closedir(d);
    qsort(list, (size_t)n, sizeof *list, by_step);
    for (int i = 0; i < n - keep; i++) {
        if (strcmp(list[i].name, current) == 0) continue;
        char p[PATH_MAX];
        join(p, sizeof p, dir, list[i].name);
        ch_file_remove_flat_dir(p);
    }
    free(list);
}

ch_status ch_checkpoint_save(const ch_ckpt_run *run, const char *dir, const char *name,
                             const ch_ckpt_position *pos, ch_err *err)
{
    CH_TRY(ch_checkpoint_prepare(dir, err));
    char tmp[PATH_MAX], dst[PATH_MAX], old[PATH_MAX];
    CH_ASSERT(snprintf(tmp, sizeof tmp, "%s/" MARK "tmp-%s-%ld", dir, name, (long)getpid()) < (int)sizeof tmp);
    join(dst, sizeof dst, dir, name);
    CH_ASSERT(snprintf(old, sizeof old, "%s/" MARK "old-%s-%ld", dir, name, (long)getpid()) < (int)sizeof old);
    ch_file_remove_flat_dir(tmp);
    if (mkdir(tmp, 0777) != 0)
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: cannot create (%s)", tmp, strerror(errno));
    ch_status st = write_into(run, tmp, pos, err);
    if (st != CH_STATUS_OK) {
        ch_file_remove_flat_dir(tmp);
        return st;
    }
    /* A checkpoint of the same name (a rerun) moves aside first: rename cannot replace a
     * non-empty directory. */
    const bool had = rename(dst, old) == 0;
    if (rename(tmp, dst) != 0) {
        st = ch_fail(err, CH_STATUS_SYSTEM, "%s: rename failed (%s)", dst, strerror(errno));
        if (had) rename(old, dst);
        ch_file_remove_flat_dir(tmp);
        return st;
    }
    CH_TRY(ch_file_sync_path(dir, err));
    crash_point("rename");
    CH_TRY(point_latest(dir, name, err));
    crash_point("latest");
    if (had) ch_file_remove_flat_dir(old);
    prune(dir, run->cfg->keep, name);
    return CH_STATUS_OK;
}

ch_status ch_checkpoint_export(const ch_model *m, const char *model_name, const char *file, ch_err *err)
{
    CH_TRY(check_length(file, err));
    ch_st_tensor *ts = calloc((size_t)m->ntensors + 1, sizeof *ts);
    float *vals = malloc(sizeof(float) * (m->nparams + m->nbuffers + 1));
    ch_status st = ts && vals ? CH_STATUS_OK : CH_SYS_FAIL(err, "allocation of export buffers");
    const char *const meta[][2] = { { "format", "pt" }, { "writer", "cohort " CH_VERSION },
                                    { "model", model_name } };
    ch_out out = { 0 };
    if (st == CH_STATUS_OK) st = ch_out_open(&out, file, "--out", err);
    if (st == CH_STATUS_OK) {
        const int n = model_tensors(m, ts, vals, err);
        st = n < 0 ? CH_STATUS_SYSTEM : ch_st_write_to(out.f, file, ts, n, meta, 3, err);
        if (st == CH_STATUS_OK) st = ch_out_commit(&out, err);
        else ch_out_abandon(&out);
    }
    free(ts);
    free(vals);
    return st;
}

ch_status ch_checkpoint_check_path(const char *path, ch_err *err) { return check_length(path, err); }

/* ---- loading ------------------------------------------------------------------------------ */

bool ch_checkpoint_has_latest(const char *dir)
{
    char probe[PATH_MAX];
    struct stat st;
    join(probe, sizeof probe, dir, "latest");
    return lstat(probe, &st) == 0;
}

bool ch_checkpoint_find_any(const char *dir, char *name, size_t len)
{
    if (ch_checkpoint_has_latest(dir)) {
        snprintf(name, len, "latest");
        return true;
    }
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));)
        if (strncmp(e->d_name, "epoch-", 6) == 0 || strncmp(e->d_name, "step-", 5) == 0) {
            snprintf(name, len, "%s", e->d_name);
            found = true;
        }
    closedir(d);
    return found;
}

ch_status ch_checkpoint_resolve(const char *path, char *out, size_t len, ch_err *err)
{
    CH_TRY(check_length(path, err));
    char probe[PATH_MAX];
    join(probe, sizeof probe, path, "trainer.json");
    if (access(probe, F_OK) == 0) {
        snprintf(out, len, "%s", path);
        return CH_STATUS_OK;
    }
    join(probe, sizeof probe, path, "latest");
    if (!ch_checkpoint_has_latest(path))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no checkpoint here (no trainer.json, no latest)", path);
    struct stat st;
    if (stat(probe, &st) != 0)   /* there (lstat), but a symlink that leads nowhere or loops */
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a symbolic link that cannot be followed (%s): name a checkpoint "
                       "with --resume DIR/epoch-NNNN, or repair latest", probe, strerror(errno));
    /* A symbolic link (as cohort writes it), or a text file naming the entry (as it wrote it before,
     * and as a user may): either way a plain entry name. */
    char *name = NULL;
    if (lstat(probe, &st) == 0 && S_ISLNK(st.st_mode)) {
        name = calloc(1, 256);
        CH_CHECK_ALLOC(err, name);
        const ssize_t n = readlink(probe, name, 255);
        if (n <= 0 || n >= 255) name[0] = '/';   /* unreadable or too long: refused below */
        else name[n] = '\0';
    } else {
        name = read_text(probe, 255, err);
        if (!name) return CH_STATUS_BAD_INPUT;
        name[strcspn(name, "\r\n")] = 0;
    }
    /* A plain entry of this folder, as cohort writes it: never ".", "..", a path or a dot file. */
    bool plain = name[0] && name[0] != '.';
    for (const char *c = name; plain && *c; c++) plain = *c > ' ' && *c != '/' && *c != 0x7f;
    if (!plain) {
        free(name);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: does not name a checkpoint of this folder", probe);
    }
    snprintf(out, len, "%s/%s", path, name);
    free(name);
    return CH_STATUS_OK;
}

typedef ch_ckpt_staged staged;

void ch_checkpoint_staged_free(ch_ckpt_staged *s)
{
    free(s->params);
    free(s->buffers);
    for (int i = 0; i < CH_OPTIM_MAX_STATE; i++) free(s->state[i]);
    free(s->counters);
}

static const cJSON *field(const cJSON *j, const char *key) { return cJSON_GetObjectItemCaseSensitive(j, key); }

static cJSON *read_trainer_doc(const char *dir, char *path, size_t len, ch_err *err)
{
    join(path, len, dir, "trainer.json");
    uint8_t *text = NULL;
    size_t n = 0;
    if (ch_file_read(path, 1 << 20, &text, &n, err) != CH_STATUS_OK) return NULL;
    cJSON *j = ch_position_parse_doc((const char *)text, n, path, err);
    free(text);
    return j;
}

static ch_status read_trainer_json(const ch_ckpt_run *run, const char *dir, staged *s, ch_err *err)
{
    char path[PATH_MAX];
    join(path, sizeof path, dir, "trainer.json");
    const ch_ckpt_expect e = { .model = run->model_name, .classes = run->model->classes,
                               .seed = run->cfg->seed, .train_samples = run->train_samples,
                               .batch_size = run->cfg->batch_size,
                               .optimizer = ch_optim_kind_name(run->optim->kind) };
    uint8_t *text = NULL;
    size_t n = 0;
    CH_TRY(ch_file_read(path, 1 << 20, &text, &n, err));
    ch_status st = ch_checkpoint_parse_position((const char *)text, n, path, &e, &s->pos, &s->opt_steps, err);
    free(text);
    return st;
}

/* The name as the file has it: a `module.` prefix on every tensor (DataParallel) is dropped. */
static const ch_st_tensor *find_tensor(const ch_st_file *f, const char *name, bool module)
{
    char full[CH_ST_NAME_MAX + 16];
    snprintf(full, sizeof full, "%s%s", module ? "module." : "", name);
    return ch_st_find(f, full);
}

static bool all_prefixed(const ch_st_file *f)
{
    for (int i = 0; i < f->ntensors; i++)
        if (strncmp(f->tensors[i].name, "module.", 7) != 0) return false;
    return f->ntensors > 0;
}

static ch_status check_tensor(const char *path, const ch_tensor_ref *r, const ch_st_tensor *x,
                              ch_st_dtype want, ch_err *err)
{
    if (!x) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' is missing", path, r->name);
    if (x->dtype != want)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' is %s, expected %s", path, r->name,
                       ch_st_dtype_name(x->dtype), ch_st_dtype_name(want));
    ch_st_tensor exp = { 0 };
    shape_of(r, &exp);
    bool same = exp.ndim == x->ndim;
    for (int i = 0; same && i < exp.ndim; i++) same = exp.shape[i] == x->shape[i];
    if (!same) {
        char a[96] = "", b[96] = "";
        for (int i = 0; i < exp.ndim; i++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", i ? "x" : "", (long long)exp.shape[i]);
        for (int i = 0; i < x->ndim; i++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", i ? "x" : "", (long long)x->shape[i]);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' has shape [%s], the model needs [%s]",
                       path, r->name, b, a);
    }
    return CH_STATUS_OK;
}

static void copy_f32(ch_real *dst, const void *src, size_t n)
{
    const unsigned char *p = src;
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        dst[i] = (ch_real)v;
    }
}

/* Values training cannot start from: NaN or infinity anywhere, a negative running variance
 * (BatchNorm would take its square root). Refused with the tensor named, unless allowed. */
static ch_status check_values(const char *path, const char *name, const ch_real *v, size_t n, bool allow,
                              ch_err *err)
{
    if (allow) return CH_STATUS_OK;
    const size_t len = strlen(name);
    const bool variance = len >= 11 && strcmp(name + len - 11, "running_var") == 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' holds %s at element %zu (not finite; "
                           "--allow-nonfinite loads it anyway)", path, name,
                           isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf", i);
        if (variance && v[i] < 0)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' holds a negative variance %g at element "
                           "%zu (--allow-nonfinite loads it anyway)", path, name, (double)v[i], i);
    }
    return CH_STATUS_OK;
}

/* The state_dict of f into s; every tensor present with its dtype and shape, nothing else. */
static ch_status stage_model(const ch_model *m, const char *path, const ch_st_file *f, bool allow,
                             staged *s, ch_err *err)
{
    const bool module = all_prefixed(f);
    int used = 0;
    for (int k = 0; k < m->ntensors; k++) {
        const ch_tensor_ref *r = &m->tensors[k];
        const ch_st_tensor *x = find_tensor(f, r->name, module);
        CH_TRY(check_tensor(path, r, x, r->kind == CH_TENSOR_COUNTER ? CH_ST_I64 : CH_ST_F32, err));
        used++;
        if (r->kind == CH_TENSOR_COUNTER) {
            int64_t c;
            memcpy(&c, x->data, sizeof c);
            if (c < 0 || c > (int64_t)1 << 53)
                return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' is %lld, expected a count 0..2^53", path,
                               r->name, (long long)c);
            s->counters[r->counter - m->counters] = (double)c;
        } else {
            ch_real *base = r->kind == CH_TENSOR_PARAM ? s->params : s->buffers;
            copy_f32(base + r->spec->offset, x->data, r->spec->count);
            CH_TRY(check_values(path, r->name, base + r->spec->offset, r->spec->count, allow, err));
        }
    }
    if (used != f->ntensors)
        for (int i = 0; i < f->ntensors; i++) {
            const char *name = f->tensors[i].name + (module ? 7 : 0);
            if (!ch_model_find(m, name))
                return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' is not part of %s", path,
                               f->tensors[i].name, m->arch);
        }
    return CH_STATUS_OK;
}

static ch_status stage_optimizer(const ch_model *m, const ch_optim *o, const char *path, const ch_st_file *f,
                                 bool allow, staged *s, ch_err *err)
{
    s->has_state = f->ntensors > 0;
    if (!s->has_state) return CH_STATUS_OK;
    if (o->nstate == 0 && o->c.kind == CH_OPTIM_SGD && strstr(f->tensors[0].name, ".momentum_buffer"))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: trained with SGD momentum (it holds momentum buffers); "
                       "resume with --momentum as it was trained", path);
    int used = 0;
    for (int b = 0; b < o->nstate; b++)
        for (int k = 0; k < m->ntensors; k++) {
            const ch_tensor_ref *r = &m->tensors[k];
            if (r->kind != CH_TENSOR_PARAM) continue;
            char name[CH_ST_NAME_MAX];
            snprintf(name, sizeof name, "%s.%s", r->name, ch_optim_state_name(o, b));
            const ch_st_tensor *x = ch_st_find(f, name);
            if (!x) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' is missing", path, name);
            CH_TRY(check_tensor(path, r, x, CH_ST_F32, err));
            copy_f32(s->state[b] + r->spec->offset, x->data, r->spec->count);
            CH_TRY(check_values(path, name, s->state[b] + r->spec->offset, r->spec->count, allow, err));
            used++;
        }
    if (used != f->ntensors)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %d tensors that are no %s state of this model",
                       path, f->ntensors - used, ch_optim_kind_name(o->c.kind));
    return CH_STATUS_OK;
}

ch_status ch_checkpoint_stage_alloc(const ch_ckpt_run *run, ch_ckpt_staged *s, ch_err *err)
{
    const ch_model *m = run->model;
    s->params = calloc(m->nparams + 1, sizeof(ch_real));
    for (int i = 0; i < CH_OPTIM_MAX_STATE; i++) {
        s->state[i] = calloc(m->nparams + 1, sizeof(ch_real));
        CH_CHECK_ALLOC(err, s->state[i]);
    }
    s->buffers = calloc(m->nbuffers + 1, sizeof(ch_real));
    s->counters = calloc((size_t)m->ncounters + 1, sizeof(double));
    if (!s->params || !s->buffers || !s->counters)
        return CH_SYS_FAIL(err, "allocation of checkpoint staging buffers");
    return CH_STATUS_OK;
}

static ch_status stage_file(const ch_model *m, const ch_optim *opt, const char *path, bool optimizer,
                            bool allow, staged *s, ch_err *err)
{
    ch_st_file *f = NULL;
    CH_TRY(ch_st_read(path, &f, err));
    ch_status st = optimizer ? stage_optimizer(m, opt, path, f, allow, s, err)
                             : stage_model(m, path, f, allow, s, err);
    ch_st_free(f);
    return st;
}

/* The checkpoint of a graph model holds the same graph as the run's (by fingerprint). */
static ch_status check_graph(const ch_ckpt_run *run, const char *dir, ch_err *err)
{
    ch_graph *g = NULL;
    uint64_t print = 0;
    CH_TRY(ch_checkpoint_graph(dir, &g, err));
    const ch_status st = g ? ch_graph_fingerprint(g, &print, err) : CH_STATUS_OK;
    ch_graph_free(g);
    CH_TRY(st);
    if (print != run->graph_print)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the checkpoint's model (%s) is not this run's %s", dir,
                       print ? "its graph.json" : "a model of the zoo", run->graph_print ? "graph" : "zoo model");
    return CH_STATUS_OK;
}

ch_status ch_checkpoint_stage(const ch_ckpt_run *run, const char *dir, const char *weights,
                              ch_ckpt_staged *s, ch_err *err)
{
    const bool allow = run->cfg->allow_nonfinite;
    if (weights) return stage_file(run->model, NULL, weights, false, allow, s, err);
    char path[PATH_MAX];
    CH_TRY(read_trainer_json(run, dir, s, err));
    CH_TRY(check_graph(run, dir, err));
    join(path, sizeof path, dir, "model.safetensors");
    CH_TRY(stage_file(run->model, NULL, path, false, allow, s, err));
    join(path, sizeof path, dir, "optimizer.safetensors");
    return stage_file(run->model, run->opt, path, true, allow, s, err);
}

void ch_checkpoint_apply(const ch_ckpt_staged *s, ch_model *m, ch_optim *opt)
{
    /* The staged values are host ch_real, checked already: they go up as they are. */
    ch_backend_upload(m->be, m->params, s->params, sizeof(ch_real) * m->nparams);
    ch_backend_upload(m->be, m->buffers, s->buffers, sizeof(ch_real) * m->nbuffers);
    for (int i = 0; i < m->ncounters; i++) m->counters[i] = (int64_t)s->counters[i];
    for (int i = 0; opt && s->has_state && i < opt->nstate; i++)
        ch_backend_upload(m->be, opt->state[i], s->state[i], sizeof(ch_real) * m->nparams);
}

ch_status ch_checkpoint_peek(const char *path, char *model, size_t len, int *classes, char *normalize,
                             size_t nlen, int *image_side, ch_err *err)
{
    char dir[PATH_MAX], file[PATH_MAX];
    CH_TRY(ch_checkpoint_resolve(path, dir, sizeof dir, err));
    cJSON *j = read_trainer_doc(dir, file, sizeof file, err);
    if (!j) return CH_STATUS_BAD_INPUT;
    const cJSON *m = field(j, "model"), *c = field(j, "classes");
    ch_status st = CH_STATUS_OK;
    if (!cJSON_IsString(m) || !cJSON_IsNumber(c) || !(c->valuedouble >= 1 && c->valuedouble <= 65535))
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no model name or class count (1..65535)", file);
    else {
        snprintf(model, len, "%s", m->valuestring);
        *classes = (int)c->valuedouble;
        const cJSON *n = field(field(j, "config"), "normalize"), *in = field(j, "input");
        snprintf(normalize, nlen, "%s", cJSON_IsString(n) ? n->valuestring : "");
        const cJSON *h = cJSON_IsArray(in) && cJSON_GetArraySize(in) == 3 ? cJSON_GetArrayItem(in, 1) : NULL;
        *image_side = cJSON_IsNumber(h) && h->valuedouble >= 1 && h->valuedouble <= 4096 ? (int)h->valuedouble : 0;
    }
    cJSON_Delete(j);
    return st;
}

ch_status ch_checkpoint_graph(const char *path, ch_graph **out, ch_err *err)
{
    char dir[PATH_MAX], file[PATH_MAX];
    *out = NULL;
    CH_TRY(ch_checkpoint_resolve(path, dir, sizeof dir, err));
    join(file, sizeof file, dir, "graph.json");
    if (access(file, F_OK) != 0) return CH_STATUS_OK;
    uint8_t *text = NULL;
    size_t n = 0;
    CH_TRY(ch_file_read(file, 16 << 20, &text, &n, err));
    const ch_status st = ch_graph_from_json((const char *)text, n, file, out, err);
    free(text);
    return st;
}

/* The architecture a checkpoint directory was written for, built (unplanned) to check its files. */
static ch_status model_of(const char *dir, ch_model **out, char *name, size_t len, ch_err *err)
{
    char file[PATH_MAX];
    cJSON *j = read_trainer_doc(dir, file, sizeof file, err);
    if (!j) return CH_STATUS_BAD_INPUT;
    const cJSON *m = field(j, "model"), *in = field(j, "input");
    uint64_t c = 0;
    ch_status st = ch_json_whole(file, j, "classes", 1, 65535, &c, err);
    if (st == CH_STATUS_OK && (!cJSON_IsString(m) || !cJSON_IsArray(in) || cJSON_GetArraySize(in) != 3))
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no model name or input shape", file);
    /* The input shape sizes every layer: bounded as the data readers bound images (4096 x 4096,
     * 4096 channels), so a hostile file cannot ask for terabytes of weights. */
    int dims[3] = { 0, 0, 0 };
    for (int i = 0; st == CH_STATUS_OK && i < 3; i++) {
        const cJSON *v = cJSON_GetArrayItem(in, i);
        const double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (!(d >= 1 && d <= 4096 && d == floor(d)))
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: input dimension %d is %g, expected a whole number 1..4096",
                         file, i, d);
        else
            dims[i] = (int)d;
    }
    ch_graph *g = NULL;
    if (st == CH_STATUS_OK) st = ch_checkpoint_graph(dir, &g, err);
    if (st == CH_STATUS_OK) {
        snprintf(name, len, "%s", m->valuestring);
        const ch_shape3 in3 = { dims[0], dims[1], dims[2] };
        st = g ? ch_model_create_graph(g, in3, (int)c, ch_backend_host(), out, err) : ch_zoo_model(name, in3, (int)c, ch_backend_host(), out, err);
    }
    ch_graph_free(g);
    cJSON_Delete(j);
    return st;
}

ch_status ch_checkpoint_export_dir(const char *path, const char *file, ch_err *err)
{
    char dir[PATH_MAX], name[64], weights[PATH_MAX];
    CH_TRY(ch_checkpoint_resolve(path, dir, sizeof dir, err));
    ch_model *m = NULL;
    CH_TRY(model_of(dir, &m, name, sizeof name, err));
    staged s = { 0 };
    join(weights, sizeof weights, dir, "model.safetensors");
    const ch_ckpt_run run = { .model = m };
    ch_status st = ch_checkpoint_stage_alloc(&run, &s, err);
    /* Export copies what is there: a diverged run's weights are still the user's to inspect. */
    if (st == CH_STATUS_OK) st = stage_file(m, NULL, weights, false, true, &s, err);
    if (st == CH_STATUS_OK) {
        ch_checkpoint_apply(&s, m, NULL);
        st = ch_checkpoint_export(m, name, file, err);
    }
    ch_checkpoint_staged_free(&s);
    ch_model_free(m);
    return st;
}
