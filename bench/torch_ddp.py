"""PyTorch DistributedDataParallel (gloo backend) images/second: the reference bench/ranks compares
cohort's MPI ranks against. NPROC processes x THREADS threads, the global batch split evenly,
synthetic 1x28x28 inputs, SGD; rank 0 prints the job's rate (the slowest rank's time).

usage: torch_ddp.py MODEL GLOBAL_BATCH NPROC THREADS STEPS WARMUP
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from torch_reference import MODELS  # noqa: E402


def worker(rank, model_name, batch, nproc, threads, steps, warmup, port):
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=nproc)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(MODELS[model_name]())
    local = batch // nproc
    x = torch.rand(local, 1, 28, 28)
    y = torch.randint(0, 10, (local,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    el = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(el, op=dist.ReduceOp.MAX)
    if rank == 0:
        el = el.item()
        print(f"model={model_name} batch={batch} ranks={nproc} threads={threads} mode=ddp-gloo "
              f"steps={steps} time={el:.3f} img/s={steps * batch / el:.1f}", flush=True)
    dist.destroy_process_group()


def main():
    model_name, batch, nproc, threads, steps, warmup = sys.argv[1:7]
    args = (model_name, int(batch), int(nproc), int(threads), int(steps), int(warmup),
            29500 + os.getpid() % 1000)
    mp.spawn(worker, args=args, nprocs=int(nproc), join=True)


if __name__ == "__main__":
    main()
