"""One SGD step of a SqueezeNet (torchvision's Fire modules, ceil-mode max pooling, zero-started
biases, at 28x28) in cohort against PyTorch in float64, for squeeze_step.sh.

A step's biases start at zero, so each bias after the step is its update, and a ReLU whose input
lies within float rounding of zero may pass or block its gradient depending on the order of a sum:
one flipped mask moves every gradient upstream by a whole term (issue 41 measured a 3x3 conv's bias
1.7e-3 of its update off: its channel 14 had a pre-activation of 1.3e-7). The fixture is therefore
the first seed whose pre-activations all lie at least 1e-6 from zero (100 times the rounding of
their sums); on it, float32 arithmetic in any order gives the float64 step within rounding, and so
must cohort.

The same check takes a U-Net that upsamples with nn.ConvTranspose2d (unet_t), one that resizes
bilinearly (unet_bilinear: half-pixel and align_corners), a net whose conv and linear modules are called twice (twice), a ConvNeXt-style net (convnext: GELU and LayerNorm, channels-last and over
trailing dimensions), a small ShuffleNetV2 (shuffle: torchvision's units, x.chunk(2, 1), the channel
shuffle's 5-D view and transpose, BatchNorm with eps 1e-3 and momentum 0.3, whose running statistics
after the step are checked too), a tiny U-Net (unet: nn.Upsample, nearest, x2, and a skip concatenation) and
gelu: ConvNeXt-style pieces cohort has (a patchify stem, a 7x7
depthwise conv, pointwise convs, nn.GELU() exported through Erf and approximate='tanh' through Tanh, a
residual), with PyTorch's default initialisation.

  python3 squeeze_step.py make DIR DATA_ROOT [squeeze|gelu|unet|unet_t|unet_bilinear|shuffle|convnext|twice]   DIR/model.onnx, DIR/init.pt, DIR/seed
  python3 squeeze_step.py check DIR DATA_ROOT COHORT_MODEL.safetensors
"""
import copy
import gzip
import json
import os
import struct
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from torch_export import export as onnx_export  # noqa: E402

BATCH, LR, NEAR = 8, 0.1, 1e-6


class Fire(nn.Module):
    def __init__(self, cin, sq, e1, e3):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, sq, 1)
        self.expand1x1 = nn.Conv2d(sq, e1, 1)
        self.expand3x3 = nn.Conv2d(sq, e3, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.expand1x1(x)), F.relu(self.expand3x3(x))], 1)


class Squeeze(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      Fire(16, 4, 8, 8), Fire(16, 4, 8, 8), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      Fire(16, 8, 16, 16))
        self.classifier = nn.Sequential(nn.Dropout(p=0.0), nn.Conv2d(32, 10, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        for m in self.modules():   # torchvision's SqueezeNet initialisation
            if isinstance(m, nn.Conv2d):
                if m is self.classifier[1]:
                    nn.init.normal_(m.weight, 0.0, 0.01)
                else:
                    nn.init.kaiming_uniform_(m.weight)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


class GeluNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 4, stride=4)
        self.dw = nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.pw1 = nn.Conv2d(8, 16, 1)
        self.act1 = nn.GELU()
        self.pw2 = nn.Conv2d(16, 8, 1)
        self.act2 = nn.GELU(approximate="tanh")
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.stem(x)
        x = self.act2(x + self.pw2(self.act1(self.pw1(self.dw(x)))))
        return self.fc(x.mean((2, 3)))


class UNet(nn.Module):
    """A tiny U-Net: an encoder level, nn.Upsample (nearest, x2) back to the input's size, the skip
    concatenated, a decoder conv."""
    def __init__(self):
        super().__init__()
        self.enc1 = nn.Conv2d(1, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec = nn.Conv2d(24, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        e1 = F.relu(self.enc1(x))
        e2 = F.relu(self.enc2(F.max_pool2d(e1, 2)))
        d = F.relu(self.dec(torch.cat([self.up(e2), e1], 1)))
        return self.fc(F.adaptive_avg_pool2d(d, 1).flatten(1))


def channel_shuffle(x, groups):
    """ShuffleNet's shuffle as torchvision writes it: a 5-D view, transpose(1, 2), a view back."""
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, -1, h, w)


class ShuffleUnit(nn.Module):
    """torchvision's ShuffleNetV2 InvertedResidual: at stride 1 the input's halves (x.chunk(2, 1)),
    one passed through, at stride 2 two branches; concatenated, then the channel shuffle."""
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride, f = stride, cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                                         nn.Conv2d(cin, f, 1, bias=False), nn.BatchNorm2d(f), nn.ReLU())
        self.branch2 = nn.Sequential(nn.Conv2d(cin if stride > 1 else f, f, 1, bias=False), nn.BatchNorm2d(f), nn.ReLU(),
                                     nn.Conv2d(f, f, 3, stride, 1, groups=f, bias=False), nn.BatchNorm2d(f),
                                     nn.Conv2d(f, f, 1, bias=False), nn.BatchNorm2d(f), nn.ReLU())

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNet(nn.Module):
    """A small ShuffleNetV2: stem, max pool, a stage of three units, a 1x1 conv, the mean, a classifier.
    BatchNorm with eps and momentum of its own, so a dropped argument shows."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.stage = nn.Sequential(ShuffleUnit(16, 32, 2), ShuffleUnit(32, 32, 1), ShuffleUnit(32, 32, 1))
        self.conv5 = nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.fc = nn.Linear(64, 10)
        for mod in self.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.eps, mod.momentum = 1e-3, 0.3

    def forward(self, x):
        return self.fc(self.conv5(self.stage(self.stem(x))).mean((2, 3)))


class ConvNeXtNet(nn.Module):
    """ConvNeXt's pieces with GELU and LayerNorm as its code writes them: a patchify stem, the
    channels-last LayerNorm (permute, LayerNorm(c), permute back), a 7x7 depthwise conv, an inverted
    bottleneck with GELU, a residual; then LayerNorms over the last axis, over (c, h, w) and over the
    pooled features. Exported at opset 17, where nn.LayerNorm is one LayerNormalization."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 4, stride=4)
        self.stem_norm = nn.LayerNorm(16, eps=1e-6)
        self.dw = nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.norm = nn.LayerNorm(16, eps=1e-6)
        self.pw1 = nn.Conv2d(16, 64, 1)
        self.act = nn.GELU()
        self.pw2 = nn.Conv2d(64, 16, 1)
        self.norm_w = nn.LayerNorm(7, eps=1e-3)
        self.norm_all = nn.LayerNorm([16, 7, 7])
        self.head_norm = nn.LayerNorm(16, eps=1e-4)
        self.fc = nn.Linear(16, 10)
        with torch.no_grad():   # weights and biases away from 1 and 0, so that a dropped one shows
            for mod in self.modules():
                if isinstance(mod, nn.LayerNorm):
                    mod.weight.uniform_(0.5, 1.5)
                    mod.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        y = self.norm(self.dw(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = x + self.pw2(self.act(self.pw1(y)))
        x = self.norm_all(self.norm_w(x))
        return self.fc(self.head_norm(x.mean((2, 3))))


class Twice(nn.Module):
    """Modules called twice: a conv (each call with a BatchNorm of its own), a BatchNorm (its running
    statistics move twice a step, num_batches_tracked counts 2) and a linear layer, so their
    parameters' gradients are sums over two uses; the state_dict has them once."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8, momentum=0.3)
        self.bn2 = nn.BatchNorm2d(8, eps=1e-3)
        self.shared = nn.BatchNorm2d(8, eps=1e-4, momentum=0.2)
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.stem(x)), 2)
        x = F.relu(self.bn1(self.conv(x)))
        x = F.relu(self.bn2(self.conv(x)))
        x = F.relu(self.shared(torch.tanh(self.shared(x))))
        return self.out(self.fc(torch.tanh(self.fc(x.mean((2, 3))))))


class UNetT(nn.Module):
    """A U-Net whose decoder upsamples with nn.ConvTranspose2d: 2x2 stride 2 without bias (the
    original U-Net's up-convolution), and 3x3 stride 2 with padding 1 and output_padding 1."""
    def __init__(self):
        super().__init__()
        self.enc1 = nn.Conv2d(1, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 16, 3, padding=1)
        self.enc3 = nn.Conv2d(16, 16, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(16, 16, 2, stride=2, bias=False)
        self.dec2 = nn.Conv2d(32, 16, 3, padding=1)
        self.up1 = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.dec1 = nn.Conv2d(16, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        e1 = F.relu(self.enc1(x))
        e2 = F.relu(self.enc2(F.max_pool2d(e1, 2)))
        e3 = F.relu(self.enc3(F.max_pool2d(e2, 2)))
        d2 = F.relu(self.dec2(torch.cat([self.up2(e3), e2], 1)))
        d1 = F.relu(self.dec1(torch.cat([self.up1(d2), e1], 1)))
        return self.fc(d1.mean((2, 3)))


class UNetBilinear(nn.Module):
    """A U-Net step with bilinear upsampling (nn.Upsample(scale_factor=2, mode='bilinear'), half-pixel)
    and a side branch resized by F.interpolate(size=(10, 10), align_corners=True), not a whole factor."""
    def __init__(self):
        super().__init__()
        self.enc1 = nn.Conv2d(1, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear")
        self.dec = nn.Conv2d(24, 8, 3, padding=1)
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        e1 = F.relu(self.enc1(x))
        e2 = F.relu(self.enc2(F.max_pool2d(e1, 2)))
        d = F.relu(self.dec(torch.cat([self.up(e2), e1], 1)))
        side = F.interpolate(e2, size=(10, 10), mode="bilinear", align_corners=True)
        return self.fc(torch.cat([d.mean((2, 3)), side.mean((2, 3))], 1))


class Permutes(nn.Module):
    """x.permute of (c, h, w) other than around a LayerNorm, each order once as the export has it (it
    fuses consecutive transposes, so elementwise ops sit between them): h and w swapped before a
    conv, a channels-last view read by Sigmoid (the importer makes its mark a node), the permute
    back of a plain tensor, c and h swapped before a conv over the former rows, and the full reversal
    (x.permute(0, 2, 3, 1).transpose(1, 2), one Transpose in the file) before the classifier."""
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, momentum=0.3)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(14, 6, 3, padding=1)
        self.fc = nn.Linear(14 * 8 * 6, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)    # (8, 14, 14)
        x = self.conv2(x.permute(0, 1, 3, 2))
        x = torch.tanh(torch.sigmoid(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        x = F.relu(self.conv3(x.permute(0, 2, 1, 3)))           # (6, 8, 14)
        x = x.permute(0, 2, 3, 1).transpose(1, 2)               # (14, 8, 6)
        return self.fc(torch.flatten(x, 1))


MODELS = {"squeeze": Squeeze, "gelu": GeluNet, "unet": UNet, "shuffle": ShuffleNet, "convnext": ConvNeXtNet,
          "twice": Twice, "unet_t": UNetT, "unet_bilinear": UNetBilinear, "permute": Permutes}


def data(root):
    def idx(path, off):
        return np.frombuffer(gzip.open(path).read(), np.uint8, offset=off)
    x = idx(root + "/mnist/train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:BATCH] / 255.0
    y = idx(root + "/mnist/train-labels-idx1-ubyte.gz", 8)[:BATCH].astype(np.int64)
    return x, y


def nearest_to_zero(m, x):
    """The smallest non-zero |input| of any ReLU (a conv's or a BatchNorm's output), in float64."""
    seen = []
    hooks = [c.register_forward_hook(lambda mod, i, o: seen.append(o.detach().abs()))
             for c in m.modules() if isinstance(c, (nn.Conv2d, nn.BatchNorm2d))]
    m(torch.tensor(x))
    for h in hooks:
        h.remove()
    return min(float(v[v > 0].min()) for v in seen if (v > 0).any())


def step(m, x, y, dtype):
    m = m.to(dtype)
    loss = F.cross_entropy(m(torch.tensor(x, dtype=dtype)), torch.tensor(y))
    m.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            p -= LR * p.grad
    return {k: v.detach().double().numpy() for k, v in m.state_dict().items()}


def load_safetensors(path):
    """The file's tensors as float64 arrays, and as the tensors of their own types (for load_state_dict)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out, typed = {}, {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k != "__metadata__":
            lo, hi = v["data_offsets"]
            a = np.frombuffer(raw[8 + n + lo:8 + n + hi], {"F32": "<f4", "I64": "<i8"}[v["dtype"]]).reshape(v["shape"])
            out[k], typed[k] = a.astype(np.float64), torch.from_numpy(a.copy())
    return out, typed


def make(out, root, name):
    x, _ = data(root)
    for seed in range(100):
        torch.manual_seed(seed)
        m = MODELS[name]()
        # GELU has no kink: any seed does.
        if name in ("gelu", "convnext") or nearest_to_zero(copy.deepcopy(m).double(), x) >= NEAR:
            break
    else:
        sys.exit("squeeze_step: no seed below 100 keeps every pre-activation 1e-6 from zero")
    m = m.float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_export(m, torch.zeros(2, 1, 28, 28), out + "/model.onnx", opset_version=17 if name == "convnext" else 13,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    # After the export: tracing in training mode ran a forward that moved BatchNorm's running statistics
    # (running_var 1 -> 0.7 at momentum 0.3), and the file holds the moved ones, which cohort starts from.
    torch.save(m.state_dict(), out + "/init.pt")
    open(out + "/seed", "w").write(f"{seed}\n")
    open(out + "/model", "w").write(name)
    print(f"squeeze_step: seed {seed}, the nearest pre-activation {nearest_to_zero(copy.deepcopy(m).double(), x):.2e} "
          "from zero")


def check(out, root, got_path):
    x, y = data(root)
    init = torch.load(out + "/init.pt")
    make_model = MODELS[open(out + "/model").read()]
    res = {}
    for dt in (torch.float32, torch.float64):
        m = make_model()
        m.load_state_dict(init)
        res[dt] = step(m, x, y, dt)
    got, typed = load_safetensors(got_path)
    make_model().load_state_dict(typed, strict=True)   # every name and shape PyTorch's, nothing extra
    start = {k: v.double().numpy() for k, v in init.items()}
    worst_c, worst_t, failed = 0.0, 0.0, []
    for k, want in res[torch.float64].items():
        if k.endswith("num_batches_tracked"):
            # ONNX files carry no step count: cohort counts its own steps from 0 (one here), PyTorch
            # from the export's trace on.
            if got[k] != want - start[k]:
                failed.append(k)
            continue
        update = np.abs(want - start[k]).max()
        scale = max(update, 1e-6 * np.abs(want).max())
        c = np.abs(got[k] - want).max() / scale
        t = np.abs(res[torch.float32][k] - want).max() / scale
        worst_c, worst_t = max(worst_c, c), max(worst_t, t)
        print(f"{k:32s} cohort {c:9.2e}  torch float32 {t:9.2e}  (of the update)")
        # Rounding of the float32 parameters (1 ulp of a weight is 1e-3 of a small update) plus that of the
        # sums: within 4x PyTorch's own float32 distance, or 1e-5 of the update, whichever is larger.
        if c > max(4 * t, 1e-5):
            failed.append(k)
    print(f"squeeze_step: worst cohort {worst_c:.2e}, PyTorch float32 {worst_t:.2e} of the float64 update")
    if failed:
        sys.exit("squeeze_step: further from the float64 step than float32 rounding: " + ", ".join(failed))


if __name__ == "__main__":
    {"make": lambda: make(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "squeeze"), "check": lambda: check(sys.argv[2], sys.argv[3], sys.argv[4])}[sys.argv[1]]()
