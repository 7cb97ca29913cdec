/* The ranks' shares of a global batch: parsing --shares, the largest-remainder cut, auto's
 * re-balancing from measured step times. */
#include "train/shares.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ch_status parse_list(ch_shares *s, const char *text, ch_err *err)
{
    const char *p = text;
    for (int r = 0;; r++) {
        char *end;
        errno = 0;
        const long long v = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : -1;
        if (v < 1 || v > CH_SHARES_MAX || errno || (v >= 0 && *end != ',' && *end != '\0'))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "--shares '%.100s': expected auto or one whole number in "
                           "1..%d per rank, comma-separated (e.g. 3,1)", text, CH_SHARES_MAX);
        if (r == s->procs)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "--shares '%.100s': more shares than the job's %d rank%s",
                           text, s->procs, s->procs == 1 ? "" : "s");
        s->w[r] = v;
        if (*end == '\0') {
            if (r + 1 != s->procs)
                return ch_fail(err, CH_STATUS_BAD_INPUT, "--shares '%.100s': %d share%s for the job's %d rank%s "
                               "(one per rank)", text, r + 1, r ? "s" : "", s->procs, s->procs == 1 ? "" : "s");
            return CH_STATUS_OK;
        }
        p = end + 1;
    }
}

ch_status ch_shares_init(ch_shares *s, const char *text, int procs, int devices, ch_err *err)
{
    *s = (ch_shares){ .procs = procs, .devices = devices };
    const size_t R = (size_t)procs * (size_t)devices;
    s->w = malloc(sizeof *s->w * (size_t)procs);
    s->order = malloc(sizeof *s->order * R);
    s->rem = malloc(sizeof *s->rem * R);
    if (!s->w || !s->order || !s->rem) {
        ch_shares_free(s);
        return CH_SYS_FAIL(err, "allocation of the ranks' shares");
    }
    for (int r = 0; r < procs; r++) s->w[r] = CH_SHARES_UNIT;
    if (!text || !*text) return CH_STATUS_OK;
    s->given = true;
    if (strcmp(text, "auto") == 0) {
        s->automatic = true;
        return CH_STATUS_OK;
    }
    const ch_status st = parse_list(s, text, err);
    if (st != CH_STATUS_OK) ch_shares_free(s);
    return st;
}

void ch_shares_free(ch_shares *s)
{
    free(s->w);
    free(s->order);
    free(s->rem);
    s->w = NULL;
    s->order = NULL;
    s->rem = NULL;
}

static int64_t total_weight(const ch_shares *s)
{
    int64_t T = 0;
    for (int r = 0; r < s->procs; r++) T += s->w[r];
    return T * s->devices;
}

void ch_shares_split(const ch_shares *s, int n, int *count)
{
    const int R = s->procs * s->devices;
    const int64_t T = total_weight(s);
    int left = n;
    for (int g = 0; g < R; g++) {
        const int64_t part = (int64_t)n * s->w[g / s->devices];
        count[g] = (int)(part / T);
        s->rem[g] = part % T;
        left -= count[g];
        /* Insertion by (remainder descending, index ascending): R is small and mostly in order. */
        int i = g;
        while (i > 0 && s->rem[s->order[i - 1]] < s->rem[g]) {
            s->order[i] = s->order[i - 1];
            i--;
        }
        s->order[i] = g;
    }
    for (int i = 0; i < left; i++) count[s->order[i]]++;
}

int ch_shares_max_slice(const ch_shares *s, int B)
{
    const int R = s->procs * s->devices;
    if (s->automatic) return B / s->devices + (B % s->devices != 0);
    if (ch_shares_equal(s)) return (B + R - 1) / R;
    /* A replica's part of n is floor(n w / T) or one more: at most floor(B w / T) + 1 for n <= B. */
    int64_t wmax = 0;
    for (int r = 0; r < s->procs; r++) wmax = s->w[r] > wmax ? s->w[r] : wmax;
    const int64_t most = (int64_t)B * wmax / total_weight(s) + 1;
    return most < B ? (int)most : B;
}

bool ch_shares_equal(const ch_shares *s)
{
    for (int r = 1; r < s->procs; r++)
        if (s->w[r] != s->w[0]) return false;
    return true;
}

void ch_shares_format(const ch_shares *s, char *out, size_t len)
{
    size_t at = 0;
    out[0] = '\0';
    for (int r = 0; r < s->procs && at < len; r++) {
        const int k = snprintf(out + at, len - at, "%s%" PRId64, r ? "," : "", s->w[r]);
        if (k < 0) break;
        at += (size_t)k;
    }
}

bool ch_shares_set(ch_shares *s, const int64_t *w, int n)
{
    if (n != s->procs) return false;
    for (int r = 0; r < n; r++)
        if (w[r] < 1 || w[r] > CH_SHARES_MAX) return false;
    memcpy(s->w, w, sizeof *w * (size_t)n);
    return true;
}

bool ch_shares_rebalance(ch_shares *s, const double *busy_s, const double *samples)
{
    const int P = s->procs;
    double sum = 0;
    for (int r = 0; r < P; r++) {
        if (!(busy_s[r] > 0) || !(samples[r] > 0)) return false;   /* a rank with nothing measured */
        sum += samples[r] / busy_s[r];
    }
    if (!(sum > 0) || !isfinite(sum)) return false;
    int64_t *next = s->rem;   /* scratch of R >= P values */
    bool moved = false;
    for (int r = 0; r < P; r++) {
        double v = (double)CH_SHARES_UNIT * P * (samples[r] / busy_s[r]) / sum;
        v = fmin(fmax(v, CH_SHARES_UNIT / 16.0), CH_SHARES_UNIT * 16.0);
        next[r] = (int64_t)llround(v);
        if (llabs(next[r] - s->w[r]) * 20 > s->w[r]) moved = true;
    }
    if (moved) memcpy(s->w, next, sizeof *next * (size_t)P);
    return moved;
}
