#!/usr/bin/env python3
"""Pillow's answers for test_image.c, written at test time into OUT (Pillow is the reference:
torchvision's ImageFolder decodes and resizes with it).

  OUT/files.txt    NAME W H: an image file and the size of Pillow's convert("RGB") of it
  OUT/NAME         PNG (gray, RGB, RGBA, palette, gray+alpha) and JPEG (RGB, gray, CMYK) files
  OUT/NAME.rgb     Pillow's convert("RGB") bytes
  OUT/resize.txt   X0 Y0 X1 Y1 OW OH FILE: Pillow's bilinear resize of box (X0, Y0, X1, Y1) of
                   rgb.png to OW x OH, bytes in FILE
  OUT/folder/      a two-class ImageFolder holding rgb.png in val/a: its evaluation transform
  OUT/center.rgb   Resize(73) + CenterCrop(64) of rgb.png, as torchvision does it
  OUT/bad/         files that must be refused: truncated, corrupt, huge declared sizes
"""
import os
import struct
import sys
import zlib

from PIL import Image


def smooth_image(w, h):
    img = Image.new("RGB", (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            px[x, y] = ((x * 255) // (w - 1), (y * 255) // (h - 1), ((x * 7 + y * 13) * 3) % 256)
    return img


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)


def huge_png():
    """A valid PNG header that declares 100000 x 100000 pixels (and a tiny IDAT)."""
    ihdr = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) +
            png_chunk(b"IEND", b""))


def huge_jpeg(path_small):
    """A real JPEG whose SOF0 marker is patched to declare 60000 x 60000 pixels."""
    data = bytearray(open(path_small, "rb").read())
    at = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, at + 5, 60000, 60000)
    return bytes(data)


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "bad"), exist_ok=True)
    base = smooth_image(97, 61)
    forms = {
        "rgb.png": base,
        "gray.png": base.convert("L"),
        "rgba.png": base.convert("RGBA"),
        "graya.png": base.convert("LA"),
        "palette.png": base.convert("P", palette=Image.ADAPTIVE, colors=50),
        "rgb.jpg": base,
        "gray.jpg": base.convert("L"),
        "cmyk.jpg": base.convert("CMYK"),   # Adobe CMYK: Pillow converts it, so must we
    }
    with open(os.path.join(out, "files.txt"), "w") as listing:
        for name, img in forms.items():
            if name == "rgba.png":
                img.putalpha(77)
            if name == "graya.png":
                img.putalpha(200)
            path = os.path.join(out, name)
            img.save(path, format="JPEG" if name.endswith(".jpg") else "PNG", **({"quality": 85} if name.endswith(".jpg") else {}))
            rgb = Image.open(path).convert("RGB")
            open(path + ".rgb", "wb").write(rgb.tobytes())
            listing.write(f"{name} {rgb.width} {rgb.height}\n")

    with open(os.path.join(out, "resize.txt"), "w") as listing:
        cases = [((0, 0, 97, 61), (64, 64)), ((10, 5, 60, 50), (32, 32)), ((20, 10, 40, 30), (64, 48)),
                 ((3, 0, 94, 61), (7, 5)), ((0, 0, 97, 61), (200, 120))]
        for k, (box, size) in enumerate(cases):
            r = base.resize(size, Image.BILINEAR, box=box)
            f = f"resize{k}.rgb"
            open(os.path.join(out, f), "wb").write(r.tobytes())
            listing.write(f"{box[0]} {box[1]} {box[2]} {box[3]} {size[0]} {size[1]} {f}\n")

    # torchvision's Resize(73) (shorter side; the other int(73 * long / short)) then CenterCrop(64)
    # (offsets int(round((size - 64) / 2))), as its PIL path does it.
    w, h = base.size
    short = 73
    ow, oh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    r = base.resize((ow, oh), Image.BILINEAR)
    top, left = int(round((oh - 64) / 2.0)), int(round((ow - 64) / 2.0))
    open(os.path.join(out, "center.rgb"), "wb").write(r.crop((left, top, left + 64, top + 64)).tobytes())
    for split, cls in (("train", "a"), ("train", "b"), ("val", "a")):
        os.makedirs(os.path.join(out, "folder", split, cls), exist_ok=True)
        base.save(os.path.join(out, "folder", split, cls, "img.png"))

    bad = os.path.join(out, "bad")
    png = open(os.path.join(out, "rgb.png"), "rb").read()
    jpg = open(os.path.join(out, "rgb.jpg"), "rb").read()
    open(os.path.join(bad, "truncated.png"), "wb").write(png[:len(png) // 2])
    open(os.path.join(bad, "truncated.jpg"), "wb").write(jpg[:len(jpg) // 2])
    corrupt = bytearray(png)
    for i in range(60, len(corrupt) - 20, 7):
        corrupt[i] ^= 0x5a
    open(os.path.join(bad, "corrupt.png"), "wb").write(bytes(corrupt))
    corrupt = bytearray(jpg)
    for i in range(len(corrupt) // 2, len(corrupt) - 4, 5):
        corrupt[i] = 0xff if i % 2 else corrupt[i] ^ 0x33
    open(os.path.join(bad, "corrupt.jpg"), "wb").write(bytes(corrupt))
    open(os.path.join(bad, "huge.png"), "wb").write(huge_png())
    open(os.path.join(bad, "huge.jpg"), "wb").write(huge_jpeg(os.path.join(out, "rgb.jpg")))
    open(os.path.join(bad, "text.png"), "wb").write(b"this is not an image\n")
    open(os.path.join(bad, "empty.jpg"), "wb").write(b"")


if __name__ == "__main__":
    main()
