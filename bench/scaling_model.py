#!/usr/bin/env python3
"""Step time and scaling efficiency of synchronous data parallelism at N nodes (docs/SCALING.md).

Weak scaling: every node trains the same per-node batch, so the compute per step, C, does not
change with N; what grows is the gradient exchange. One rank per node, a full-bisection switch,
every link B bytes/s each way, alpha seconds per message.

  fp32, ring allreduce (Open MPI's choice for large messages):
      X(N) = 2 (N - 1) / N * S / B + 2 (N - 1) * alpha
  bf16, cohort's pairwise reduce-scatter + allgather (--grad-compress bf16):
      X(N) = 2 (N - 1) / N * (S / 2) / (w B) + 2 * alpha * ceil((N - 1) / W) + n * k
    (the N - 1 messages of a phase are in flight together, W at a time; k is the time per gradient
    value to round, sum and decode; w the fraction of the link rate it reaches on large buckets,
    both measured)
  exposed exchange: the buckets overlap backward, hiding up to H seconds of it:
      E = max(0, X(N) - H),  step = C + E,  efficiency = C / step

H comes from a measured pair of step times on rate-limited links: H = X(2) - (step(2) - C).
Every input is a flag; defaults are the measurements of docs/SCALING.md.
"""
import argparse
import math


def exchange(n_nodes, grad_bytes, link_bps, alpha, compressed, k_per_value, window, wire_eff=1.0):
    if n_nodes == 1:
        return 0.0
    b = link_bps / 8.0
    frac = 2.0 * (n_nodes - 1) / n_nodes
    if not compressed:
        return frac * grad_bytes / b + 2 * (n_nodes - 1) * alpha
    values = grad_bytes / 4.0
    return (frac * grad_bytes / 2.0 / (b * wire_eff) + 2 * alpha * math.ceil((n_nodes - 1) / window)
            + values * k_per_value)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="resnet18")
    ap.add_argument("--compute-ms", type=float, required=True, help="C: one node's step without exchange")
    ap.add_argument("--grad-mb", type=float, required=True, help="S: fp32 gradient bytes, MB (1e6)")
    ap.add_argument("--hidden-ms", type=float, default=0.0, help="H: exchange hidden under backward")
    ap.add_argument("--alpha-us", type=float, default=30.0, help="per-message latency (TCP over Ethernet)")
    ap.add_argument("--k-ns", type=float, default=1.0, help="bf16 conversion and sum, ns per value")
    ap.add_argument("--bf16-wire", type=float, default=0.65,
                    help="fraction of the link rate the bf16 exchange reaches at large sizes (measured)")
    ap.add_argument("--window", type=int, default=64, help="bf16: messages in flight at once")
    ap.add_argument("--nodes", default="2,8,16,32,64,128,256")
    ap.add_argument("--gbits", default="1,10,100")
    a = ap.parse_args()
    C = a.compute_ms / 1e3
    S = a.grad_mb * 1e6
    H = a.hidden_ms / 1e3
    nodes = [int(x) for x in a.nodes.split(",")]
    print(f"{a.name}: C = {a.compute_ms:g} ms, S = {a.grad_mb:g} MB, H = {a.hidden_ms:g} ms, "
          f"alpha = {a.alpha_us:g} us, k = {a.k_ns:g} ns/value")
    print("| link | nodes | fp32 exchange ms | fp32 step ms | fp32 efficiency | bf16 exchange ms | "
          "bf16 step ms | bf16 efficiency |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for g in [float(x) for x in a.gbits.split(",")]:
        for n in nodes:
            row = []
            for comp in (False, True):
                x = exchange(n, S, g * 1e9, a.alpha_us * 1e-6, comp, a.k_ns * 1e-9, a.window, a.bf16_wire)
                step = C + max(0.0, x - H)
                row += [f"{x * 1e3:.0f}", f"{step * 1e3:.0f}", f"{100 * C / step:.0f}%"]
            print(f"| {g:g} Gbit/s | {n} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
