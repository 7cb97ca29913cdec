/* Device lists: "cpu:0,cpu:1", "cpu:0-3", "cpu*4", and the same for GPUs (cuda:0) and the test
 * backends (scramble, lazy). Whether a GPU is there is the backend's to say, when it starts. A CPU
 * device is a logical device: a replica with its own thread and a share of the cores; its index
 * names it, it does not pick a core. "cuda:local" is the device whose index is the process's local
 * rank (ch_world_local_rank: torchrun's LOCAL_RANK), so that one command line under mpirun gives
 * each rank of a host its own GPU. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort.h"
#include "core/status.h"

static bool parse_index(const char **p, long *out)
{
    if (!isdigit((unsigned char)**p)) return false;
    char *end;
    *out = strtol(*p, &end, 10);
    *p = end;
    return *out >= 0 && *out < CH_MAX_DEVICES;
}

static const char *const kind_names[CH_DEVICE_KINDS] = { "cpu", "scramble", "lazy", "cuda" };

const char *ch_device_kind_name(ch_device_kind kind)
{
    return kind >= 0 && kind < CH_DEVICE_KINDS ? kind_names[kind] : "?";
}

void ch_device_name(const ch_device *d, char *buf, size_t len)
{
    snprintf(buf, len, "%s:%d", ch_device_kind_name(d->kind), d->index);
}

static ch_status add_device(ch_device_list *l, ch_device_kind kind, long index, const char *spec,
                            ch_err *err)
{
    /* One backend per job: replicas of two kinds would sum through memory of two kinds. */
    if (l->count && l->dev[0].kind != kind)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': %s and %s devices in one list; use one kind", spec,
                       kind_names[l->dev[0].kind], kind_names[kind]);
    for (int i = 0; i < l->count; i++)
        if (l->dev[i].kind == kind && l->dev[i].index == index)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': %s:%ld is listed twice", spec,
                           kind_names[kind], index);
    if (l->count == CH_MAX_DEVICES)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': more than %d devices", spec,
                       CH_MAX_DEVICES);
    l->dev[l->count++] = (ch_device){ .kind = kind, .index = (int)index };
    return CH_STATUS_OK;
}

/* One entry: KIND:K | KIND:A-B | KIND*N. *p is left after it. */
static ch_status parse_entry(const char **p, ch_device_list *l, const char *spec, ch_err *err)
{
    if (strncmp(*p, "gpu", 3) == 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': GPUs are named cuda:K (cuda:0, cuda:0-1, cuda*2)", spec);
    ch_device_kind kind = CH_DEVICE_KINDS;
    for (int k = 0; k < CH_DEVICE_KINDS; k++) {
        const size_t n = strlen(kind_names[k]);
        if (strncmp(*p, kind_names[k], n) == 0 && ((*p)[n] == ':' || (*p)[n] == '*')) kind = (ch_device_kind)k;
    }
    if (kind == CH_DEVICE_KINDS)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "devices '%s': expected entries like cpu:0, cpu:0-3, cpu*4 or cuda:0 (or scramble:K, lazy:K: test backends)",
                       spec);
    *p += strlen(kind_names[kind]);
    long a, b;
    if (**p == '*') {
        ++*p;
        if (!parse_index(p, &a) || a < 1)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': cpu*N needs N in 1..%d", spec,
                           CH_MAX_DEVICES - 1);
        for (long i = 0; i < a; i++) CH_TRY(add_device(l, kind, i, spec, err));
        return CH_STATUS_OK;
    }
    if (**p != ':') return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': expected cpu:K", spec);
    ++*p;
    if (strncmp(*p, "local", 5) == 0 && !isalnum((unsigned char)(*p)[5]) && (*p)[5] != '-') {
        *p += 5;
        a = ch_world_local_rank();
        if (a >= CH_MAX_DEVICES)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': local rank %ld has no device (0..%d)", spec, a,
                           CH_MAX_DEVICES - 1);
        return add_device(l, kind, a, spec, err);
    }
    if (!parse_index(p, &a))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': device index must be 0..%d or local", spec,
                       CH_MAX_DEVICES - 1);
    b = a;
    if (**p == '-') {
        ++*p;
        if (!parse_index(p, &b) || b < a)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': range cpu:A-B needs A <= B <= %d",
                           spec, CH_MAX_DEVICES - 1);
    }
    for (long i = a; i <= b; i++) CH_TRY(add_device(l, kind, i, spec, err));
    return CH_STATUS_OK;
}

ch_status ch_device_list_parse(const char *spec, ch_device_list *out, ch_err *err)
{
    *out = (ch_device_list){ 0 };
    if (!spec || !*spec) return ch_fail(err, CH_STATUS_BAD_INPUT, "empty device list");
    const char *p = spec;
    for (;;) {
        while (*p == ' ') p++;
        CH_TRY(parse_entry(&p, out, spec, err));
        while (*p == ' ') p++;
        if (*p == '\0') return CH_STATUS_OK;
        if (*p != ',')
            return ch_fail(err, CH_STATUS_BAD_INPUT, "devices '%s': unexpected '%c' at position %d",
                           spec, *p, (int)(p - spec) + 1);
        p++;
    }
}

void ch_device_list_format(const ch_device_list *l, char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; i < l->count && at < len; i++) {
        char name[32];
        ch_device_name(&l->dev[i], name, sizeof name);
        int w = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", name);
        if (w < 0) return;
        at += (size_t)w;
    }
}
