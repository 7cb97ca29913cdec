"""Are two safetensors files' float tensors within TOL of each other? Each tensor's distance is
||a - b|| / max(||a||, 1e-3 ||a over the file||) (its own size, floored so that tensors near zero
compare against the model's scale); prints the worst and exits 1 above TOL, 2 when the names or
shapes differ.

usage: st_close.py A.safetensors B.safetensors TOL
"""
import json
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        lo, hi = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype="<f4").astype(np.float64)
    return out


def main():
    a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        print(f"st_close: {sys.argv[1]} and {sys.argv[2]} hold other tensors")
        sys.exit(2)
    scale = np.sqrt(sum(float(np.dot(v, v)) for v in a.values()))
    worst, where = 0.0, ""
    for k in a:
        d = float(np.linalg.norm(a[k] - b[k])) / max(float(np.linalg.norm(a[k])), 1e-3 * scale)
        if d > worst:
            worst, where = d, k
    print(f"st_close: worst {worst:.3g} ({where}), tolerance {tol:g}")
    sys.exit(1 if worst > tol else 0)


if __name__ == "__main__":
    main()
