/* Augmentation while gathering a batch (see augment.h). */
#include "data/augment.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

static ch_status parse_list(const char *s, double *out, int want, const char *what, ch_err *err)
{
    int n = 0;
    const char *p = s;
    while (*p && n < CH_AUG_MAX_CHANNELS) {
        char *end;
        out[n] = strtod(p, &end);
        if (end == p) break;
        n++;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    if (*p || (n != 1 && n != want))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize: the %s '%s' needs 1 or %d numbers", what, s, want);
    for (int i = n; i < want; i++) out[i] = out[0];
    return CH_STATUS_OK;
}

ch_status ch_augment_parse_normalize(ch_augment *a, const char *spec, int channels, ch_err *err)
{
    if (channels > CH_AUG_MAX_CHANNELS)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize: %d channels, at most %d", channels, CH_AUG_MAX_CHANNELS);
    a->normalize = true;
    if (strcmp(spec, "imagenet") == 0) {
        static const double m[3] = { 0.485, 0.456, 0.406 }, s[3] = { 0.229, 0.224, 0.225 };
        if (channels != 3) return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize imagenet needs 3 channels, the data has %d", channels);
        memcpy(a->mean, m, sizeof m);
        memcpy(a->std, s, sizeof s);
        return CH_STATUS_OK;
    }
    const char *slash = strchr(spec, '/');
    char mean[256];
    if (!slash || (size_t)(slash - spec) >= sizeof mean)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize '%s': expected imagenet or MEAN/STD, like 0.5,0.5,0.5/0.25,0.25,0.25", spec);
    snprintf(mean, sizeof mean, "%.*s", (int)(slash - spec), spec);
    CH_TRY(parse_list(mean, a->mean, channels, "mean", err));
    CH_TRY(parse_list(slash + 1, a->std, channels, "std", err));
    for (int c = 0; c < channels; c++)
        if (!(a->std[c] > 0)) return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize: std %g must be > 0", a->std[c]);
    return CH_STATUS_OK;
}

/* One sample: random window offset (dy, dx) into the padded image, optional flip, normalize. */
static void one(const ch_augment *a, const ch_dataset *d, uint32_t i, bool train, uint64_t seed, int epoch,
                ch_real *x)
{
    const int C = d->c, H = d->h, W = d->w, P = train && a->crop_padding > 0 ? a->crop_padding : 0;
    int dy = 0, dx = 0;
    bool flip = false;
    if (train && (P > 0 || a->flip)) {
        uint32_t r[4];
        ch_philox(seed, CH_RNG_STREAM_AUGMENT, ((uint64_t)(uint32_t)epoch << 32) | i, r);
        dy = P ? (int)(r[0] % (uint32_t)(2 * P + 1)) - P : 0;
        dx = P ? (int)(r[1] % (uint32_t)(2 * P + 1)) - P : 0;
        flip = a->flip && (r[2] & 1u);
    }
    const uint8_t *src = d->images + (size_t)i * C * H * W;
    for (int c = 0; c < C; c++) {
        const double scale = a->normalize ? 1.0 / (255.0 * a->std[c]) : 1.0 / 255.0;
        const double shift = a->normalize ? a->mean[c] / a->std[c] : 0;
        for (int y = 0; y < H; y++) {
            const int sy = y + dy;
            ch_real *row = x + ((size_t)c * H + y) * W;
            for (int xx = 0; xx < W; xx++) {
                const int sx = (flip ? W - 1 - xx : xx) + dx;
                const int v = sy >= 0 && sy < H && sx >= 0 && sx < W ? src[((size_t)c * H + sy) * W + sx] : 0;
                row[xx] = (ch_real)(v * scale - shift);
            }
        }
    }
}

void ch_augment_gather(const ch_augment *a, const ch_dataset *d, const uint32_t *idx, int count,
                       bool train, uint64_t seed, int epoch, ch_real *x, int32_t *labels)
{
    const size_t per = (size_t)d->c * d->h * d->w;
    for (int k = 0; k < count; k++) {
        one(a, d, idx[k], train, seed, epoch, x + (size_t)k * per);
        labels[k] = d->labels[idx[k]];
    }
}
