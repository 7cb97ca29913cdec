/* PNG and JPEG decoding and bilinear resampling (see image.h). */
#include "data/image.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* jpeglib.h needs size_t and FILE declared first. */
#include <jpeglib.h>

ch_image_format ch_image_sniff(const uint8_t *data, size_t len)
{
    static const uint8_t png_sig[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
    if (len >= 8 && memcmp(data, png_sig, 8) == 0) return CH_IMAGE_PNG;
    if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return CH_IMAGE_JPEG;
    return CH_IMAGE_UNKNOWN;
}

static ch_status check_size(const char *name, size_t max_pixels, unsigned long w, unsigned long h,
                            ch_err *err)
{
    if (w == 0 || h == 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the image is %lux%lu", name, w, h);
    if (w > max_pixels || h > max_pixels || (size_t)w * (size_t)h > max_pixels)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the image declares %lux%lu pixels, more than the "
                       "limit of %zu (a decompression bomb?)", name, w, h, max_pixels);
    return CH_STATUS_OK;
}

/* ---- PNG: libpng's simplified API, which turns every error into a return code. ---- */

static ch_status png_fail(png_image *img, const char *name, ch_err *err)
{
    ch_status st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: not a readable PNG (%s)", name,
                           img->message[0] ? img->message : "libpng error");
    png_image_free(img);
    return st;
}

static ch_status png_header(const uint8_t *data, size_t len, const char *name, size_t max_pixels,
                            png_image *img, ch_err *err)
{
    memset(img, 0, sizeof *img);
    img->version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(img, data, len)) return png_fail(img, name, err);
    ch_status st = check_size(name, max_pixels, img->width, img->height, err);
    if (st != CH_STATUS_OK) png_image_free(img);
    return st;
}

static ch_status decode_png(const uint8_t *data, size_t len, const char *name, size_t max_pixels,
                            ch_image *out, ch_err *err)
{
    png_image img;
    CH_TRY(png_header(data, len, name, max_pixels, &img, err));
    /* Alpha is dropped, not composited, as Pillow's convert("RGB") does: read RGBA, keep RGB. */
    const bool alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
    img.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
    const size_t w = img.width, h = img.height, ch = alpha ? 4 : 3;
    uint8_t *px = malloc(w * h * ch);
    if (!px) {
        png_image_free(&img);
        return CH_SYS_FAIL(err, "allocation of a decoded image");
    }
    if (!png_image_finish_read(&img, NULL, px, 0, NULL)) {
        free(px);
        return png_fail(&img, name, err);
    }
    png_image_free(&img);
    if (alpha)
        for (size_t i = 0; i < w * h; i++) memmove(px + 3 * i, px + 4 * i, 3);
    *out = (ch_image){ .w = (int)w, .h = (int)h, .rgb = px };
    return CH_STATUS_OK;
}

/* ---- JPEG: libjpeg-turbo, errors and warnings brought back by longjmp. ---- */

typedef struct jpeg_guard {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} jpeg_guard;

static void jpeg_on_error(j_common_ptr cinfo)
{
    jpeg_guard *g = (jpeg_guard *)cinfo->err;
    g->pub.format_message(cinfo, g->message);
    longjmp(g->jump, 1);
}

/* A warning means corrupt or truncated data (libjpeg would fill the rest with grey): an error. */
static void jpeg_on_message(j_common_ptr cinfo, int level)
{
    if (level < 0) jpeg_on_error(cinfo);
}

static void jpeg_quiet(j_common_ptr cinfo) { (void)cinfo; }

/* Pillow's CMYK JPEG path: the stored values are Adobe's inverted ones ("CMYK;I"), and
 * convert("RGB") takes r = (255 - k) - c (255 - k) / 255, its integer rounding included. */
static void cmyk_to_rgb(const uint8_t *in, uint8_t *out, size_t w)
{
    for (size_t x = 0; x < w; x++, in += 4, out += 3) {
        const int nk = in[3];   /* 255 - k, with k inverted */
        for (int c = 0; c < 3; c++) {
            const int v = 255 - in[c], t = v * nk + 128;
            const int r = nk - (((t >> 8) + t) >> 8);
            out[c] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
        }
    }
}

/* Runs the decode; the caller owns *px (NULL on failure). volatile: survives the longjmp. */
static ch_status decode_jpeg(const uint8_t *data, size_t len, const char *name, size_t max_pixels,
                             bool header_only, ch_image *out, ch_err *err)
{
    struct jpeg_decompress_struct cinfo;
    jpeg_guard g;
    uint8_t *volatile px = NULL, *volatile line = NULL;
    cinfo.err = jpeg_std_error(&g.pub);
    g.pub.error_exit = jpeg_on_error;
    g.pub.emit_message = jpeg_on_message;
    g.pub.output_message = jpeg_quiet;
    g.message[0] = '\0';
    if (setjmp(g.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(px);
        free(line);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: not a readable JPEG (%s)", name, g.message);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    ch_status st = check_size(name, max_pixels, cinfo.image_width, cinfo.image_height, err);
    if (st != CH_STATUS_OK || header_only) {
        *out = (ch_image){ .w = (int)cinfo.image_width, .h = (int)cinfo.image_height };
        jpeg_destroy_decompress(&cinfo);
        return st;
    }
    /* CMYK and YCCK (Adobe) JPEGs come out as CMYK and are converted as Pillow does. */
    const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    const size_t w = cinfo.output_width, h = cinfo.output_height;
    if (cinfo.output_components != (cmyk ? 4 : 3)) {
        jpeg_destroy_decompress(&cinfo);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a JPEG with %d components", name, cinfo.output_components);
    }
    px = malloc(w * h * 3);
    if (!px) {
        jpeg_destroy_decompress(&cinfo);
        return CH_SYS_FAIL(err, "allocation of a decoded image");
    }
    line = cmyk ? malloc(w * 4) : NULL;
    if (cmyk && !line) {
        jpeg_destroy_decompress(&cinfo);
        free(px);
        return CH_SYS_FAIL(err, "allocation of a CMYK row");
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = px + (size_t)cinfo.output_scanline * w * 3;
        if (!cmyk) {
            jpeg_read_scanlines(&cinfo, &row, 1);
            continue;
        }
        JSAMPROW in = line;
        jpeg_read_scanlines(&cinfo, &in, 1);
        cmyk_to_rgb(line, row, w);
    }
    /* finish may still fail (and jump): the row is freed only after it, once. */
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(line);
    *out = (ch_image){ .w = (int)w, .h = (int)h, .rgb = px };
    return CH_STATUS_OK;
}

static ch_status unknown_format(const char *name, ch_err *err)
{
    return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: neither a PNG nor a JPEG (by its first bytes)", name);
}

ch_status ch_image_probe(const uint8_t *data, size_t len, const char *name, size_t max_pixels,
                         int *w, int *h, ch_err *err)
{
    switch (ch_image_sniff(data, len)) {
    case CH_IMAGE_PNG: {
        png_image img;
        CH_TRY(png_header(data, len, name, max_pixels, &img, err));
        *w = (int)img.width;
        *h = (int)img.height;
        png_image_free(&img);
        return CH_STATUS_OK;
    }
    case CH_IMAGE_JPEG: {
        ch_image im;
        CH_TRY(decode_jpeg(data, len, name, max_pixels, true, &im, err));
        *w = im.w;
        *h = im.h;
        return CH_STATUS_OK;
    }
    default:
        return unknown_format(name, err);
    }
}

ch_status ch_image_decode(const uint8_t *data, size_t len, const char *name, size_t max_pixels,
                          ch_image *out, ch_err *err)
{
    *out = (ch_image){ 0 };
    switch (ch_image_sniff(data, len)) {
    case CH_IMAGE_PNG: return decode_png(data, len, name, max_pixels, out, err);
    case CH_IMAGE_JPEG: return decode_jpeg(data, len, name, max_pixels, false, out, err);
    default: return unknown_format(name, err);
    }
}

/* ---- Resampling ---- */

/* For each output index: the first source index, the tap count and `taps` weights. */
typedef struct resample_axis {
    int taps;
    int *first, *count;
    float *weight;
} resample_axis;

static double triangle(double x)
{
    x = fabs(x);
    return x < 1 ? 1 - x : 0;
}

static bool axis_init(resample_axis *a, int in, double x0, double len, int out)
{
    const double scale = len / out, fs = scale > 1 ? scale : 1, support = fs;
    a->taps = (int)ceil(support) * 2 + 1;
    a->first = malloc((size_t)out * sizeof *a->first);
    a->count = malloc((size_t)out * sizeof *a->count);
    a->weight = malloc((size_t)out * (size_t)a->taps * sizeof *a->weight);
    if (!a->first || !a->count || !a->weight) return false;
    for (int o = 0; o < out; o++) {
        const double center = x0 + (o + 0.5) * scale;
        int lo = (int)floor(center - support), hi = (int)ceil(center + support);
        if (lo < 0) lo = 0;
        if (hi > in) hi = in;
        if (hi - lo > a->taps) hi = lo + a->taps;
        float *w = a->weight + (size_t)o * a->taps;
        double sum = 0;
        for (int i = lo; i < hi; i++) sum += w[i - lo] = (float)triangle((i + 0.5 - center) / fs);
        if (!(sum > 0)) {   /* a window off the image's edge: the nearest pixel */
            int near = (int)floor(center);
            lo = near < 0 ? 0 : near >= in ? in - 1 : near;
            hi = lo + 1;
            w[0] = 1;
            sum = 1;
        }
        for (int i = 0; i < hi - lo; i++) w[i] = (float)(w[i] / sum);
        a->first[o] = lo;
        a->count[o] = hi - lo;
    }
    return true;
}

static void axis_free(resample_axis *a)
{
    free(a->first);
    free(a->count);
    free(a->weight);
}

ch_status ch_image_resample(const ch_image *src, double x0, double y0, double cw, double ch, int ow,
                            int oh, uint8_t *out, ch_err *err)
{
    resample_axis ax = { 0 }, ay = { 0 };
    float *tmp = NULL, *acc = NULL;
    ch_status st = CH_STATUS_OK;
    if (!axis_init(&ax, src->w, x0, cw, ow) || !axis_init(&ay, src->h, y0, ch, oh)) {
        st = CH_SYS_FAIL(err, "allocation of resampling tables");
        goto done;
    }
    const int r0 = ay.first[0], r1 = ay.first[oh - 1] + ay.count[oh - 1];
    const size_t row_len = (size_t)ow * 3;
    tmp = malloc((size_t)(r1 - r0) * row_len * sizeof *tmp);
    acc = malloc(row_len * sizeof *acc);
    if (!tmp || !acc) {
        st = CH_SYS_FAIL(err, "allocation of a resampling buffer");
        goto done;
    }
    /* Horizontal pass over the rows the vertical pass reads, then the vertical pass. */
    for (int y = r0; y < r1; y++) {
        const uint8_t *row = src->rgb + (size_t)y * src->w * 3;
        float *t = tmp + (size_t)(y - r0) * row_len;
        for (int o = 0; o < ow; o++) {
            const float *w = ax.weight + (size_t)o * ax.taps;
            const uint8_t *p = row + (size_t)ax.first[o] * 3;
            float s0 = 0, s1 = 0, s2 = 0;
            for (int i = 0; i < ax.count[o]; i++) {
                s0 += w[i] * p[3 * i];
                s1 += w[i] * p[3 * i + 1];
                s2 += w[i] * p[3 * i + 2];
            }
            t[3 * o] = s0;
            t[3 * o + 1] = s1;
            t[3 * o + 2] = s2;
        }
    }
    for (int o = 0; o < oh; o++) {
        const float *w = ay.weight + (size_t)o * ay.taps;
        for (size_t k = 0; k < row_len; k++) acc[k] = 0;
        for (int i = 0; i < ay.count[o]; i++) {
            const float *t = tmp + (size_t)(ay.first[o] - r0 + i) * row_len;
            for (size_t k = 0; k < row_len; k++) acc[k] += w[i] * t[k];
        }
        uint8_t *dst = out + (size_t)o * row_len;
        for (size_t k = 0; k < row_len; k++) {
            const long v = lrintf(acc[k]);
            dst[k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
done:
    free(tmp);
    free(acc);
    axis_free(&ax);
    axis_free(&ay);
    return st;
}
