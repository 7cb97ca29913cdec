"""PyTorch loads cohort's checkpoints: for each model (torchvision's ResNet-18 too, on RGB data), model.safetensors goes into
model.load_state_dict(..., strict=True) of the reference program's own PyTorch model, and the
PyTorch model, in eval mode, gets the test loss and accuracy that `cohort eval` printed for the same
checkpoint and images. The file is read as safetensors.torch.load_file would (8-byte length,
JSON header, little-endian data), with the standard library and numpy: Debian has no safetensors.
Exits 77 (skipped) when torch is not installed.

usage: torch_load.py COHORT DATA_ROOT
"""
import gzip
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: python3-torch is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from torch_reference import MODELS  # noqa: E402

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def load_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def test_images(root, n):
    with gzip.open(os.path.join(root, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read()[16:], dtype=np.uint8)[: n * 784]
    with gzip.open(os.path.join(root, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read()[8:], dtype=np.uint8)[:n]
    return torch.from_numpy(x.reshape(n, 1, 28, 28).astype(np.float32) / 255), torch.from_numpy(y.astype(np.int64))


def main():
    cohort, root = sys.argv[1], os.path.join(sys.argv[2], "fashion-mnist")
    n = 500
    x, y = test_images(root, n)
    failed = []
    for model, extra in (("lenet", []), ("mnist-cnn", []), ("mlp", []),
                         ("resnet18", ["--devices", "cpu:0,cpu:1"])):
        run_one(cohort, root, model, extra, x, y, n) or failed.append(model)
    # torchvision's ResNet-18 wants RGB: the same digits as a CIFAR-format set (make_cifar.py).
    with tempfile.TemporaryDirectory() as rgb:
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "make_cifar.py"),
                        os.path.join(sys.argv[2], "mnist"), rgb, "100", str(n)], check=True)
        xr, yr = cifar_test(rgb, n)
        run_one(cohort, rgb, "resnet18-imagenet", ["--lr", "0.01"], xr, yr, n) or failed.append("resnet18-imagenet")
    sys.exit(1 if failed else 0)


def cifar_test(root, n):
    raw = np.fromfile(os.path.join(root, "test_batch.bin"), dtype=np.uint8).reshape(-1, 3073)[:n]
    return (torch.from_numpy(raw[:, 1:].reshape(n, 3, 32, 32).astype(np.float32) / 255),
            torch.from_numpy(raw[:, 0].astype(np.int64)))


def run_one(cohort, root, model, extra, x, y, n):
    """Train one epoch, checkpoint, cohort eval; PyTorch loads the checkpoint and agrees."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cohort, "train", "--model", model, "--data", root, "--train-limit", "512",
                        "--test-limit", "100", "--epochs", "1", "-b", "64", "--lr", "0.05", "--momentum", "0.9",
                        "--no-progress", "--checkpoint-dir", tmp] + extra,
                       check=True, stdout=subprocess.DEVNULL)
        out = subprocess.run([cohort, "eval", "--checkpoint", tmp, "--data", root, "--test-limit",
                              str(n)], check=True, capture_output=True, text=True).stdout
        loss_c, acc_c = map(float, re.search(r"test loss ([0-9.]+), test acc ([0-9.]+)", out).groups())
        net = MODELS[model]()
        net.load_state_dict(load_file(os.path.join(tmp, "epoch-0001", "model.safetensors")), strict=True)
        net.eval()
        with torch.no_grad():
            logits = net(x)
        loss_t = F.cross_entropy(logits, y).item()
        acc_t = (logits.argmax(1) == y).float().mean().item()
        good = abs(loss_t - loss_c) <= 1e-4 + 1e-3 * loss_c and abs(acc_t - acc_c) <= 1.5 / n
        print(f"{model:10s} cohort eval: loss {loss_c:.4f} acc {acc_c:.4f}; "
              f"PyTorch load_state_dict(strict=True): loss {loss_t:.4f} acc {acc_t:.4f} "
              f"{'ok' if good else 'MISMATCH'}")
        return good


if __name__ == "__main__":
    main()
