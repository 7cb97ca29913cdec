/* libFuzzer harness over the image decoding path of an ImageFolder: sniff, probe the header, decode
 * (PNG with libpng, JPEG with libjpeg-turbo), resample. Any input must give a clean status, never a
 * crash, a leak or undefined behaviour. Built and run by scripts/fuzz (clang). */
#include <stdint.h>
#include <stdlib.h>

#include "data/image.h"

/* A lower pixel limit than training's: valid huge images would only make the fuzzer slow. */
enum { FUZZ_MAX_PIXELS = 1 << 22 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ch_err err;
    int w, h;
    const ch_status probed = ch_image_probe(data, size, "fuzz", FUZZ_MAX_PIXELS, &w, &h, &err);
    ch_image img;
    if (ch_image_decode(data, size, "fuzz", FUZZ_MAX_PIXELS, &img, &err) != CH_STATUS_OK) return 0;
    /* What decodes must have had a readable header of the same size. */
    if (probed != CH_STATUS_OK || img.w != w || img.h != h) abort();
    uint8_t out[24 * 16 * 3];
    if (ch_image_resample(&img, 0, 0, img.w, img.h, 24, 16, out, &err) != CH_STATUS_OK) abort();
    free(img.rgb);
    return 0;
}
