#!/usr/bin/env python3
"""Writes a small ImageFolder from MNIST digits, for the tests and the loader benchmark.

    make_imagefolder.py MNIST_DIR OUT [--classes K] [--train N] [--val N] [--seed S]

OUT/train/CLASS/... and OUT/val/CLASS/... get N images per class of the first K digits, each
upscaled to a random odd size (35..95 pixels, not square), with a coloured background and ink, and
written in one of several forms: PNG grayscale, RGB, RGBA (alpha must be dropped) or palette, JPEG RGB
or grayscale; some names are upper case, some files sit in a nested folder. Nothing is downloaded.
"""
import argparse
import gzip
import os
import random
import struct

from PIL import Image


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return dims, data[4 + 4 * ndim:]


def find(mnist, name):
    for cand in (name, name + ".gz"):
        p = os.path.join(mnist, cand)
        if os.path.exists(p):
            return p
    raise SystemExit(f"make_imagefolder: {name} not in {mnist}")


def render(pixels, rng):
    """A 28x28 digit as a coloured picture of a random odd size."""
    digit = Image.frombytes("L", (28, 28), pixels)
    w, h = rng.randrange(35, 96, 2), rng.randrange(35, 96, 2)
    digit = digit.resize((w, h), Image.BILINEAR)
    bg = tuple(rng.randrange(0, 90) for _ in range(3))
    ink = tuple(rng.randrange(160, 256) for _ in range(3))
    return Image.composite(Image.new("RGB", (w, h), ink), Image.new("RGB", (w, h), bg), digit)


def save(img, path_noext, i, rng):
    form = i % 6
    upper = rng.random() < 0.2
    if form == 0:
        img, ext = img.convert("L"), ".png"
    elif form == 1:
        ext = ".png"
    elif form == 2:
        img = img.convert("RGBA")
        img.putalpha(rng.randrange(0, 256))   # dropped on decoding: the RGB must survive
        ext = ".png"
    elif form == 3:
        img, ext = img.convert("P", palette=Image.ADAPTIVE, colors=64), ".png"
    elif form == 4:
        ext = ".jpg"
    else:
        img, ext = img.convert("L"), ".jpeg"
    path = path_noext + (ext.upper() if upper else ext)
    if ext == ".png":
        img.save(path, format="PNG")
    else:
        img.save(path, format="JPEG", quality=90)


def write_split(out, split, images, labels, classes, per_class, start, rng):
    counts = [0] * classes
    i = start
    while min(counts) < per_class:
        label = labels[i]
        i += 1
        if label >= classes or counts[label] >= per_class:
            continue
        folder = os.path.join(out, split, f"digit_{label}")
        if counts[label] % 7 == 3:
            folder = os.path.join(folder, "more")   # nested: ImageFolder walks the whole tree
        os.makedirs(folder, exist_ok=True)
        img = render(images[(i - 1) * 784:i * 784], rng)
        save(img, os.path.join(folder, f"{split}_{counts[label]:05d}"), counts[label] + label, rng)
        counts[label] += 1
    return i


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mnist")
    ap.add_argument("out")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--train", type=int, default=100)
    ap.add_argument("--val", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    (n, rows, cols), images = read_idx(find(a.mnist, "train-images-idx3-ubyte"))
    _, labels = read_idx(find(a.mnist, "train-labels-idx1-ubyte"))
    assert rows == 28 and cols == 28
    rng = random.Random(a.seed)
    at = write_split(a.out, "train", images, labels, a.classes, a.train, 0, rng)
    write_split(a.out, "val", images, labels, a.classes, a.val, at, rng)


if __name__ == "__main__":
    main()
