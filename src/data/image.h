/* Decoding one image file (PNG with libpng, JPEG with libjpeg-turbo) to 8-bit RGB, and resampling.
 * Every decoder error, truncation and corrupt-data warning is an error naming the file: a damaged
 * image must never train as a half-grey picture. The declared size is checked against a pixel limit
 * before any pixel memory is allocated, so a decompression bomb costs nothing. */
#ifndef CH_DATA_IMAGE_H
#define CH_DATA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Pillow's MAX_IMAGE_PIXELS (a 1/4 gigapixel): larger images are refused. */
#define CH_IMAGE_MAX_PIXELS ((size_t)89478485)

typedef struct ch_image {
    int w, h;           /* pixels are (h, w, 3) RGB, row-major, owned */
    uint8_t *rgb;
} ch_image;

typedef enum ch_image_format { CH_IMAGE_UNKNOWN, CH_IMAGE_PNG, CH_IMAGE_JPEG } ch_image_format;

/* The format from the first bytes (the file's signature, not its name). */
ch_image_format ch_image_sniff(const uint8_t *data, size_t len);

/* Only the header: width and height, checked against max_pixels. name labels the messages. */
ch_status ch_image_probe(const uint8_t *data, size_t len, const char *name, size_t max_pixels,
                         int *w, int *h, ch_err *err);

/* The whole image as RGB (grayscale is replicated, alpha dropped, palettes expanded, 16-bit
 * reduced), as Pillow's convert("RGB"). On success the caller frees out->rgb. */
ch_status ch_image_decode(const uint8_t *data, size_t len, const char *name, size_t max_pixels,
                          ch_image *out, ch_err *err);

/* Resamples the window (x0, y0, cw, ch) of src (in source pixels, fractional) to out (oh, ow, 3)
 * bytes with Pillow's bilinear filter: a triangle filter whose support widens with the scale
 * factor when shrinking, so it antialiases as torchvision's Resize on PIL images does. */
ch_status ch_image_resample(const ch_image *src, double x0, double y0, double cw, double ch, int ow,
                            int oh, uint8_t *out, ch_err *err);

#endif
