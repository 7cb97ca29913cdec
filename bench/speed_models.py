"""Models as users write them, for bench/train_throughput: the two of issue 41's speed target, and
a wide MLP whose Linear layers are where --precision bf16's GEMMs (issue 44) matter:

  mobilenetv2  torchvision's MobileNetV2 block structure (its inverted-residual table, ReLU6, 1x1
               expand / 3x3 depthwise / 1x1 linear projection, residual where stride 1 and the width
               stays, a 1280-channel head) on 1x28x28 inputs; the stem runs at stride 1, as CIFAR
               ports of it do, so that 28x28 is not down to 1x1 by the fourth stage
  resnet20     He et al.'s CIFAR ResNet-20 (three stages of 16, 32, 64 channels, three BasicBlocks
               each), with 1x1-conv + BN shortcuts where the shape changes
  mlp2048      Flatten, Linear(784, 2048), ReLU, Linear(2048, 2048), ReLU, Linear(2048, 10): 0.4 and
               1.1 G multiply-adds a pass at batch 256, past the 2^26 from which cohort runs them in bf16

No dropout (the mask would differ from PyTorch's, and it costs nothing worth timing).
usage: speed_models.py export DIR   writes DIR/NAME.onnx for each NAME above
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from torch_reference import BasicBlock  # noqa: E402


def conv_bn(cin, cout, k, stride, groups=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, t):
        super().__init__()
        h = cin * t
        self.use_res = stride == 1 and cin == cout
        layers = [conv_bn(cin, h, 1, 1)] if t != 1 else []
        layers += [conv_bn(h, h, 3, stride, groups=h), conv_bn(h, cout, 1, 1, act=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    # torchvision's table: expansion t, channels c, repeats n, first stride s.
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]

    def __init__(self, classes=10):
        super().__init__()
        layers, cin = [conv_bn(1, 32, 3, 1)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class ResNet20(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        blocks, cin = [], 16
        for c, s in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                blocks.append(BasicBlock(cin, c, s if i == 0 else 1))
                cin = c
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def mlp2048(classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, classes))


MODELS = {"mobilenetv2": MobileNetV2, "resnet20": ResNet20, "mlp2048": mlp2048}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "export":
        sys.exit("usage: speed_models.py export DIR")
    from graph_parity import export_onnx  # noqa: E402
    for i, (name, make_model) in enumerate(MODELS.items()):
        torch.manual_seed(300 + i)
        export_onnx(make_model(), os.path.join(sys.argv[2], name + ".onnx"), 13)
