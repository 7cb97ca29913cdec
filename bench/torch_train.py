"""PyTorch's images/second for one configuration: the reference that bench/train_throughput
compares cohort against. Same model, batch, threads and synthetic 1x28x28 inputs as
`cohort bench train`.

usage: torch_train.py MODEL BATCH THREADS STEPS WARMUP train|eval [fp32|bf16]
MODEL onnx:NAME is tests/graph_models.py's or bench/speed_models.py's NAME (what cohort trains
from its ONNX export).
bf16: the one line PyTorch users add, torch.autocast('cpu', dtype=torch.bfloat16) around the
forward pass and the loss.
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from torch_reference import MODELS  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import graph_models  # noqa: E402
import speed_models  # noqa: E402


def main():
    model_name, batch, threads, steps, warmup, mode = sys.argv[1:7]
    precision = sys.argv[7] if len(sys.argv) > 7 else "fp32"
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    batch, threads, steps, warmup = int(batch), int(threads), int(steps), int(warmup)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    name = model_name[5:]
    model = (graph_models.MobileNet() if model_name == "onnx:mobilenet" else
             speed_models.MODELS[name]() if name in speed_models.MODELS else
             graph_models.MODELS[name]() if model_name.startswith("onnx:") else MODELS[model_name]())
    x = torch.rand(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if mode == "eval":
        model.eval()
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        if mode == "eval":
            with torch.no_grad(), autocast:
                model(x)
        else:
            opt.zero_grad()
            with autocast:
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    el = time.perf_counter() - t0
    print(f"model={model_name} batch={batch} threads={threads} mode={mode} precision={precision} steps={steps} "
          f"time={el:.3f} img/s={steps * batch / el:.1f}")


if __name__ == "__main__":
    main()
