"""Write a CIFAR-10-format data set (binary version) made from MNIST digits, for the tests: each
digit padded to 32x32 and put into the three colour planes with a per-image tint, label kept.

usage: make_cifar.py MNIST_DIR OUT_DIR TRAIN_PER_BATCH TEST
"""
import gzip
import os
import sys

import numpy as np


def read(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read()[offset:], dtype=np.uint8)


def write(path, images, labels, rng):
    n = len(labels)
    out = np.zeros((n, 3073), dtype=np.uint8)
    out[:, 0] = labels
    padded = np.zeros((n, 32, 32), dtype=np.float32)
    padded[:, 2:30, 2:30] = images.reshape(n, 28, 28)
    tint = rng.uniform(0.4, 1.0, size=(n, 3, 1, 1)).astype(np.float32)
    rgb = (padded[:, None, :, :] * tint).astype(np.uint8)
    out[:, 1:] = rgb.reshape(n, 3072)
    out.tofile(path)


def main():
    src, dst, per_batch, ntest = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.makedirs(dst, exist_ok=True)
    rng = np.random.default_rng(0)
    x = read(os.path.join(src, "train-images-idx3-ubyte.gz"), 16).reshape(-1, 784)
    y = read(os.path.join(src, "train-labels-idx1-ubyte.gz"), 8)
    for b in range(5):
        s = slice(b * per_batch, (b + 1) * per_batch)
        write(os.path.join(dst, f"data_batch_{b + 1}.bin"), x[s], y[s], rng)
    tx = read(os.path.join(src, "t10k-images-idx3-ubyte.gz"), 16).reshape(-1, 784)[:ntest]
    ty = read(os.path.join(src, "t10k-labels-idx1-ubyte.gz"), 8)[:ntest]
    write(os.path.join(dst, "test_batch.bin"), tx, ty, rng)


if __name__ == "__main__":
    main()
