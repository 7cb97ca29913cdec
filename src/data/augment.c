/* Augmentation while gathering a batch (see augment.h). */
#include "data/augment.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "core/rng.h"
#include "data/folder.h"
#include "data/image.h"

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
    if (*p || n == 0 || (n != 1 && n != want)) {
        if (want == 1)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize: the %s '%s' needs 1 number (the data has 1 "
                           "channel)", what, s);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize: the %s '%s' needs 1 number or %d, one per channel",
                       what, s, want);
    }
    for (int i = 0; i < n; i++)
        if (!isfinite(out[i]) || fabs(out[i]) > 1e6)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize: the %s '%s' holds %g, expected a finite value "
                           "of at most 1e6", what, s, out[i]);
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
        if (!(a->std[c] >= 1e-6))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "--normalize: std %g, expected at least 1e-6", a->std[c]);
    return CH_STATUS_OK;
}

/* ToTensor + Normalize of channel c as one affine map of the pixel: x = pixel * scale - shift. */
static void channel_affine(const ch_augment *a, int c, double *scale, double *shift)
{
    *scale = a->normalize ? 1.0 / (255.0 * a->std[c]) : 1.0 / 255.0;
    *shift = a->normalize ? a->mean[c] / a->std[c] : 0;
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
        double scale, shift;
        channel_affine(a, c, &scale, &shift);
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

/* The first 64 counters of a sample's own stream: RandomResizedCrop draws at most 41 words. */
static void sample_rng(ch_rng *r, uint64_t seed, int epoch, uint32_t i)
{
    ch_rng_init(r, seed, CH_RNG_STREAM_AUGMENT_FILE, (((uint64_t)(uint32_t)epoch << 32) | i) << 6);
}

void ch_augment_rrc_window(uint64_t seed, int epoch, uint32_t sample, int W, int H, int *x, int *y, int *w,
                           int *h)
{
    ch_rng r;
    sample_rng(&r, seed, epoch, sample);
    const double area = (double)W * H, lo = log(3.0 / 4.0), hi = log(4.0 / 3.0);
    /* torchvision's get_params: ten tries at a window of random area and aspect that fits. */
    for (int attempt = 0; attempt < 10; attempt++) {
        const double target = area * (0.08 + 0.92 * ch_rng_uniform(&r));
        const double aspect = exp(lo + (hi - lo) * ch_rng_uniform(&r));
        const int cw = (int)lrint(sqrt(target * aspect)), chh = (int)lrint(sqrt(target / aspect));
        if (cw > 0 && cw <= W && chh > 0 && chh <= H) {
            *y = (int)ch_rng_below(&r, (uint32_t)(H - chh + 1));
            *x = (int)ch_rng_below(&r, (uint32_t)(W - cw + 1));
            *w = cw;
            *h = chh;
            return;
        }
    }
    /* Then the central crop of the whole image, clamped to the ratio range. */
    const double ratio = (double)W / H;
    *w = W;
    *h = H;
    if (ratio < 3.0 / 4.0) *h = (int)lrint(W / (3.0 / 4.0));
    else if (ratio > 4.0 / 3.0) *w = (int)lrint(H * (4.0 / 3.0));
    *y = (H - *h) / 2;
    *x = (W - *w) / 2;
}

/* Evaluation: the window of the source that Resize(S*256/224) + CenterCrop(S) keeps, in source
 * pixels; the scale of the resize is per axis, as torchvision's output size is rounded. */
static void center_window(int W, int H, int S, double *x0, double *y0, double *cw, double *chh)
{
    const int short_side = (int)lround(S * 256.0 / 224.0);
    int ow, oh;
    if (W <= H) {
        ow = short_side;
        oh = (int)((long long)short_side * H / W);
    } else {
        oh = short_side;
        ow = (int)((long long)short_side * W / H);
    }
    const double sx = (double)W / ow, sy = (double)H / oh;
    /* Python 3 round(): halves to even. */
    const int top = (int)lrint((oh - S) / 2.0), left = (int)lrint((ow - S) / 2.0);
    *x0 = left * sx;
    *y0 = top * sy;
    *cw = S * sx;
    *chh = S * sy;
}

/* One ImageFolder sample: decode, crop + resize to S x S, flip, normalize into x (3, S, S). */
static ch_status one_file(const ch_augment *a, const ch_dataset *d, uint32_t i, bool train, uint64_t seed,
                          int epoch, ch_real *x, int32_t *label, uint8_t *pixels, ch_err *err)
{
    ch_image img;
    int lab;
    CH_TRY(ch_folder_decode(d, i, &img, &lab, err));
    const int S = d->h;
    double x0, y0, cw, chh;
    bool flip = false;
    if (train) {
        int wx, wy, ww, wh;
        ch_augment_rrc_window(seed, epoch, i, img.w, img.h, &wx, &wy, &ww, &wh);
        x0 = wx, y0 = wy, cw = ww, chh = wh;
        uint32_t r[4];
        ch_philox(seed, CH_RNG_STREAM_AUGMENT, ((uint64_t)(uint32_t)epoch << 32) | i, r);
        flip = a->flip && (r[2] & 1u);
    } else {
        center_window(img.w, img.h, S, &x0, &y0, &cw, &chh);
    }
    ch_status st = ch_image_resample(&img, x0, y0, cw, chh, S, S, pixels, err);
    free(img.rgb);
    CH_TRY(st);
    for (int c = 0; c < 3; c++) {
        double scale, shift;
        channel_affine(a, c, &scale, &shift);
        for (int y = 0; y < S; y++) {
            ch_real *row = x + ((size_t)c * S + y) * S;
            const uint8_t *src = pixels + (size_t)y * S * 3 + c;
            for (int xx = 0; xx < S; xx++) row[xx] = (ch_real)(src[3 * (flip ? S - 1 - xx : xx)] * scale - shift);
        }
    }
    *label = lab;
    return CH_STATUS_OK;
}

ch_status ch_augment_gather(const ch_augment *a, const ch_dataset *d, const uint32_t *idx, int count,
                            bool train, uint64_t seed, int epoch, ch_real *x, int32_t *labels, ch_err *err)
{
    const size_t per = (size_t)d->c * d->h * d->w;
    if (!d->folder) {
        for (int k = 0; k < count; k++) {
            one(a, d, idx[k], train, seed, epoch, x + (size_t)k * per);
            labels[k] = d->labels[idx[k]];
        }
        return CH_STATUS_OK;
    }
    uint8_t *pixels = malloc(per);
    CH_CHECK_ALLOC(err, pixels);
    ch_status st = CH_STATUS_OK;
    for (int k = 0; k < count && st == CH_STATUS_OK; k++)
        st = one_file(a, d, idx[k], train, seed, epoch, x + (size_t)k * per, labels + k, pixels, err);
    free(pixels);
    return st;
}
