"""Winograd F(4x4, 3x3) with its tile products in bf16: the output's error against the exact
(double) convolution, next to direct bf16 (operands rounded, sums exact). 64 channels in and out,
ReLU'd normal inputs (as after BatchNorm + ReLU), He-scaled weights, 2000 tiles. Run by
bench/wino_bf16; the matrices are cpu_wino3.c's (Lavin and Gray's, points 0, 1, -1, 2, -2, inf)."""
import numpy as np
import torch

AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], float)
BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
               [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float)
G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])


def bf16(a):
    """a rounded to bf16 (nearest even, as oneDNN's reorder), back in double."""
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    return t.to(torch.bfloat16).to(torch.float64).numpy()


def direct(x, w):
    return np.stack([np.stack([np.einsum('tcab,ocab->to', x[:, :, i:i + 3, j:j + 3], w)
                               for j in range(4)], -1) for i in range(4)], -2)


def winograd(x, w, rnd):
    v = rnd(np.einsum('ia,tcab,jb->tcij', BT, x, BT))
    u = rnd(np.einsum('ia,ocab,jb->ocij', G, w, G))
    return np.einsum('ia,toab,jb->toij', AT, np.einsum('tcij,ocij->toij', v, u), AT)


def main():
    rng = np.random.default_rng(0)
    tiles, c, oc = 2000, 64, 64
    x = np.maximum(rng.standard_normal((tiles, c, 6, 6)), 0)
    w = rng.standard_normal((oc, c, 3, 3)) * np.sqrt(2 / (9 * c))
    exact = direct(x, w)
    scale, rms = np.abs(exact).max(), np.sqrt(np.mean(exact ** 2))
    print(f"{'form':28s} {'max err / max |y|':>18s} {'rms err / rms y':>16s}")
    for name, y in (("Winograd, fp64 (check)", winograd(x, w, lambda a: a)),
                    ("direct, bf16 operands", direct(bf16(x), bf16(w))),
                    ("Winograd, bf16 products", winograd(x, w, bf16))):
        print(f"{name:28s} {np.abs(y - exact).max() / scale:18.2e} "
              f"{np.sqrt(np.mean((y - exact) ** 2)) / rms:16.2e}")


if __name__ == "__main__":
    main()
