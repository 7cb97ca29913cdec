"""PyTorch eager on a CUDA GPU: the reference bench/gpu_throughput puts cohort's CUDA backend beside.
Same model (scripts/torch_reference.py), batch, synthetic 1x28x28 inputs and 10 classes as
`cohort bench train`, plain SGD, fp32 with TF32 off in cuDNN and cuBLAS (cohort's default; PyTorch
lets cuDNN's convolutions use TF32 unless told not to). Timed over STEPS steps after WARMUP, with a
device synchronisation at both ends.

usage: torch_gpu.py MODEL BATCH STEPS WARMUP [benchmark]
benchmark: torch.backends.cudnn.benchmark = True (PyTorch's own autotuning; off by default).
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from torch_reference import MODELS  # noqa: E402


def main():
    name, batch, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    bench = len(sys.argv) > 5 and sys.argv[5] == "benchmark"
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = bench
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = MODELS[name]().to(dev)
    x = torch.rand(batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    el = time.perf_counter() - t0
    print(f"torch {torch.__version__} {torch.cuda.get_device_name()} model={name} batch={batch} "
          f"cudnn.benchmark={bench} steps={steps} time={el:.3f} img/s={steps * batch / el:.1f}")


if __name__ == "__main__":
    main()
