"""PyTorch's side of the graph parity test (graph_parity.sh runs it with Debian's python3-torch).

  make DATA_ROOT DIR   write DIR/data (32 training and 256 test images of Fashion-MNIST, as IDX) and,
                       for each model of graph_models.py and of ZOO (below; no ONNX file for
                       those), DIR/M.init.safetensors (its initial
                       state_dict), DIR/M.onnx (the same model exported in training mode, as a user
                       exports it, at opsets 13 to 17 across the models) and DIR/M.after.safetensors
                       (after one SGD step, lr 0.05, momentum 0.9, weight decay 1e-4, on the 32
                       images in one batch)
  export DIR           write DIR/M.onnx for each model as users build it (the MobileNet and the
                       HeadNet with their dropout of 0.2), for the learning test (graph_learn.sh)
  check DIR M FILE N   load cohort's export FILE into M with load_state_dict(strict=True) and check
                       that PyTorch's eval accuracy on the test images is N correct, as cohort said

safetensors are written here and read with torch_load.py's reader, with the standard library and
numpy (Debian has no safetensors).
"""
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from graph_models import LOSS, MODELS, HeadNet, MobileNet  # noqa: E402
from torch_reference import MODELS as ZOO_MODELS  # noqa: E402
from torch_load import load_file  # noqa: E402  (safetensors as safetensors.torch reads them)
from torch_export import export as onnx_export  # noqa: E402

NTRAIN, NTEST = 32, 256
# Zoo models checked the same way (their graphs are built by cohort from the name, with the
# reference programs' PyTorch modules on this side): d2l's ResNet-18 exercises every memory pass of
# the graph executor (remade BatchNorm outputs, in-place sums, gradients over values).
# The zoo models cohort builds from a name, on 1x28x28 inputs (reference programs A to D).
ZOO = {name: ZOO_MODELS[name] for name in ("resnet18", "lenet", "mnist-cnn", "mlp", "linear")}


def model_of(name):
    return MODELS[name]() if name in MODELS else ZOO[name]()
# Each model is exported at another opset, so that the four cover what cohort imports (13 to 17):
# opset 13's BatchNormalization has five outputs, 14 on a training_mode attribute.
OPSET = {"resnet": 13, "mobilenet": 15, "densenet": 16, "lognet": 17, "headnet": 14}
DTYPES = {"F32": np.float32, "I64": np.int64}
# Each model's initial weights, by name: a model added later leaves the others' fixtures (and the
# zoo's measured tolerance) as they were.
SEED = {"resnet": 100, "mobilenet": 101, "densenet": 102, "lognet": 103, "resnet18": 104, "headnet": 105, "lenet": 106, "mnist-cnn": 107,
        "mlp": 108, "linear": 109}


def save_file(tensors, path):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = t.detach().cpu().numpy()
        dtype = "I64" if a.dtype == np.int64 else "F32"
        b = a.astype(DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_idx(root, prefix, n):
    with gzip.open(os.path.join(root, prefix + "-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read()[16:16 + n * 784], dtype=np.uint8)
    with gzip.open(os.path.join(root, prefix + "-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read()[8:8 + n], dtype=np.uint8)
    return x.reshape(n, 784), y


def write_idx(dirname, prefix, x, y):
    with open(os.path.join(dirname, prefix + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, len(x), 28, 28) + x.tobytes())
    with open(os.path.join(dirname, prefix + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, len(y)) + y.tobytes())


def as_batch(x, y):
    return (torch.from_numpy(x.reshape(-1, 1, 28, 28).astype(np.float32) / 255),
            torch.from_numpy(y.astype(np.int64)))


def export_onnx(m, path, opset):
    """The export the issue and the README give users: training mode, no constant folding, the
    batch dynamic. Exporting runs the model once in training mode, which moves the module's
    BatchNorm statistics, and the file holds them as moved; it has no num_batches_tracked, which
    cohort starts at 0. So the module is reset to that too, and checked to equal the file."""
    import warnings

    import onnx
    from onnx import numpy_helper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_export(m, torch.zeros(2, 1, 28, 28), path, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=opset, input_names=["input"],
                          output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    for name, b in m.named_buffers():
        if name.endswith("num_batches_tracked"):
            b.zero_()
    state = m.state_dict()
    for t in onnx.load(path).graph.initializer:
        if not np.array_equal(numpy_helper.to_array(t), state[t.name].numpy()):
            sys.exit(f"{path}: initializer {t.name} is not the module's {t.name}")


def sgd_step(m, x, y, loss_fn):
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loss = loss_fn(m(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def float32_step(m, x, y):
    """The step as PyTorch takes it in float32 (on a copy), for write_tolerance."""
    import copy
    mm = copy.deepcopy(m).float().train()
    sgd_step(mm, x.float(), y, torch.nn.functional.cross_entropy)
    return mm.state_dict()


def write_tolerance(f32, exact, path):
    """Four times PyTorch's own float32 distance from the exact (double) step, measured as
    graph_parity.c measures cohort's (each tensor against its largest value, at least 0.05), and at
    least 1e-4: a deep net's float32 rounding is no bug, a wrong term moves a tensor by its whole
    size. Four, not two: on an AVX-512 CPU cohort runs resnet18's 3x3 convolutions as Winograd
    F(4x4, 3x3), whose transforms round more than PyTorch's direct convolution (measured: 1.47e-3
    on conv weights where PyTorch's float32 step is 5.7e-4 from the exact one)."""
    worst = max(float((f32[k].double() - v).abs().max()) / max(float(v.abs().max()), 0.05)
                for k, v in exact.items() if v.is_floating_point())
    with open(path, "w") as f:
        f.write(f"{max(4 * worst, 1e-4):.6g}\n")


def make(data_root, out):
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    xt, yt = read_idx(os.path.join(data_root, "fashion-mnist"), "train", NTRAIN)
    xv, yv = read_idx(os.path.join(data_root, "fashion-mnist"), "t10k", NTEST)
    write_idx(data, "train", xt, yt)
    write_idx(data, "t10k", xv, yv)
    x, y = as_batch(xt, yt)
    for name, make_model in list(MODELS.items()) + list(ZOO.items()):
        torch.manual_seed(SEED[name])
        m = make_model()
        if name in MODELS:
            export_onnx(m, os.path.join(out, name + ".onnx"), OPSET[name])
        save_file(m.state_dict(), os.path.join(out, name + ".init.safetensors"))
        f32 = float32_step(m, x, y) if name in ZOO else None
        # The step in double precision: the reference is the exact answer, not float32's rounding
        # of it (cohort's sums differ from PyTorch's in order, both near 1e-7).
        m.double().train()
        x = x.double()
        loss = sgd_step(m, x, y, LOSS.get(name, torch.nn.functional.cross_entropy))
        if f32 is not None:
            write_tolerance(f32, m.state_dict(), os.path.join(out, name + ".tol"))
        save_file(m.state_dict(), os.path.join(out, name + ".after.safetensors"))
        print(f"{name}: loss {loss.item():.6f}, {sum(p.numel() for p in m.parameters())} parameters")


def check(out, name, path, correct):
    m = model_of(name)
    m.load_state_dict(load_file(path), strict=True)
    m.eval()
    xv, yv = read_idx_local(os.path.join(out, "data"))
    x, y = as_batch(xv, yv)
    with torch.no_grad():
        hits = int((m(x).argmax(1) == y).sum())
    print(f"{name}: PyTorch eval {hits}/{len(y)} correct with cohort's weights, cohort said {correct}")
    return hits == int(correct)


def read_idx_local(data):
    with open(os.path.join(data, "t10k-images-idx3-ubyte"), "rb") as f:
        x = np.frombuffer(f.read()[16:], dtype=np.uint8).reshape(-1, 784)
    with open(os.path.join(data, "t10k-labels-idx1-ubyte"), "rb") as f:
        y = np.frombuffer(f.read()[8:], dtype=np.uint8)
    return x, y


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "export":
        for i, (name, make_model) in enumerate(MODELS.items()):
            torch.manual_seed(200 + i)
            m = MobileNet() if name == "mobilenet" else HeadNet() if name == "headnet" else make_model()
            export_onnx(m, os.path.join(sys.argv[2], name + ".onnx"), OPSET[name])
    elif sys.argv[1] == "check":
        # One process checks every run listed (lines "MODEL FILE CORRECT LABEL..."): importing
        # torch once instead of once per run saves about a minute of CI.
        with open(sys.argv[3]) as f:
            runs = [line.strip().split(maxsplit=3) for line in f if line.strip()]
        failed = [r[3] for r in runs if not check(sys.argv[2], r[0], r[1], r[2])]
        for label in failed:
            print(f"FAIL: {label}: PyTorch's eval accuracy with cohort's weights differs")
        sys.exit(1 if failed or not runs else 0)
    else:
        sys.exit("usage: graph_parity.py make DATA_ROOT DIR | check DIR LIST")
