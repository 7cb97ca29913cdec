"""Four PyTorch models that together use every operation of cohort's graph builder, for the parity
test (graph_parity.py) and its C twin (graph_models.c builds the same graphs with ch_graph_*):

  resnet     ResNet with BasicBlocks and downsample shortcuts (1x1 conv + BN), adaptive average pool
  mobilenet  inverted residuals: depthwise convs, ReLU6, a squeeze-excitation gate (mean over H, W,
             1x1 convs, sigmoid, mul), a residual add, mean without keepdim, dropout
  densenet   dense layers (BN-ReLU-conv, concat), max pool with ceil_mode, average pool with
             count_include_pad=False, a transition
  lognet     dilated conv, tanh, grouped conv, leaky ReLU, avg pool 3/2 with ceil_mode (a last, partial window), x.view(n, -1),
             sigmoid, Linear without bias, log_softmax
  headnet    what users write around a CNN: Hardswish, hard swish written out (x * F.relu6(x + 3) / 6),
             a squeeze-excitation gate as SENet's code has it (Linear layers, view(b, c, 1, 1),
             Hardsigmoid, expand_as), a scaled residual (x + 0.5 * (conv(x) - 0.25)), a channel
             attention through squeeze(-1) and unsqueeze(-1) twice, view(-1, N), BatchNorm1d and dropout
             in the head

All take 1x28x28 images (Fashion-MNIST) to 10 classes. dropout: the mobilenet's and headnet's rate
(0 for parity: PyTorch's and cohort's masks differ).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from torch_reference import BasicBlock  # noqa: E402  torchvision's block, as reference program B's


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1, 1, bias=False)
        # Not PyTorch's defaults: an importer or a builder that dropped eps or momentum shows.
        self.bn1 = nn.BatchNorm2d(8, eps=1e-3, momentum=0.3)
        self.layer1 = nn.Sequential(BasicBlock(8, 8, 1))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2))
        self.layer3 = nn.Sequential(BasicBlock(16, 32, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c, r):
        super().__init__()
        self.fc1 = nn.Conv2d(c, r, 1)
        self.fc2 = nn.Conv2d(r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        h = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.expand = nn.Sequential(nn.Conv2d(cin, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6())
        self.se = SqueezeExcite(h, max(h // 4, 1))
        self.project = nn.Sequential(nn.Conv2d(h, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.use_res else y


class MobileNet(nn.Module):
    def __init__(self, dropout=0.2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(8, 8, 1, 2), InvertedResidual(8, 16, 2, 2))
        self.head = nn.Sequential(nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6())
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(32, 10)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        return self.classifier(self.dropout(x.mean((2, 3))))


class DenseLayer(nn.Module):
    def __init__(self, cin, growth):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, growth, 3, 1, 1, bias=False)

    def forward(self, x):
        return torch.cat([x, self.conv(F.relu(self.norm(x)))], 1)


class DenseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(1, 8, 3, 1, 1, bias=False)
        self.pool0 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.block1 = nn.Sequential(DenseLayer(8, 4), DenseLayer(12, 4))
        self.trans = nn.Sequential(nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 1, bias=False),
                                   nn.AvgPool2d(3, 2, 1, count_include_pad=False))
        self.block2 = nn.Sequential(DenseLayer(8, 4), DenseLayer(12, 4))
        self.norm5 = nn.BatchNorm2d(16, eps=1e-4, momentum=0.05)   # not the defaults: dropped, they show
        self.classifier = nn.Linear(16, 10)

    def forward(self, x):
        x = self.block2(self.trans(self.block1(self.pool0(self.conv0(x)))))
        x = F.adaptive_avg_pool2d(F.relu(self.norm5(x)), 1)
        return self.classifier(torch.flatten(x, 1))


class LogNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=2, dilation=2)
        self.conv2 = nn.Conv2d(8, 16, 3, groups=2)
        self.fc1 = nn.Linear(16 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 10, bias=False)

    def forward(self, x):
        x = F.max_pool2d(torch.tanh(self.conv1(x)), 2)
        x = F.avg_pool2d(F.leaky_relu(self.conv2(x), 0.1), 3, 2, ceil_mode=True)
        x = x.view(x.size(0), -1)
        return F.log_softmax(self.fc2(torch.sigmoid(self.fc1(x))), dim=1)


class SEGate(nn.Module):
    def __init__(self, c, r):
        super().__init__()
        self.fc1 = nn.Linear(c, r)
        self.fc2 = nn.Linear(r, c)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        b, c, _, _ = x.size()
        y = F.adaptive_avg_pool2d(x, 1).view(b, c)
        y = self.gate(self.fc2(F.relu(self.fc1(y)))).view(b, c, 1, 1)
        return x * y.expand_as(x)


class HeadNet(nn.Module):
    def __init__(self, dropout=0.2):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.Hardswish()
        self.conv2 = nn.Conv2d(8, 16, 3, 2, 1)
        self.se = SEGate(16, 4)
        self.conv3 = nn.Conv2d(16, 16, 3, 1, 1)
        self.att = nn.Linear(16, 16)
        self.fc1 = nn.Linear(16 * 7 * 7, 32)
        self.bn_fc = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.conv2(self.act1(self.bn1(self.conv1(x))))
        x = self.se(x * F.relu6(x + 3) / 6)
        x = x + 0.5 * (self.conv3(x) - 0.25)
        a = torch.sigmoid(self.att(x.mean((2, 3), keepdim=True).squeeze(-1).squeeze(-1)))
        x = x * a.unsqueeze(-1).unsqueeze(-1)
        x = x.view(-1, 16 * 7 * 7)
        return self.fc2(self.drop(F.relu(self.bn_fc(self.fc1(x)))))


MODELS = {"resnet": ResNet, "mobilenet": lambda: MobileNet(0.0), "densenet": DenseNet, "lognet": LogNet,
          "headnet": lambda: HeadNet(0.0)}
# The loss each model is trained with in PyTorch: lognet's output is already log-probabilities.
LOSS = {"resnet": F.cross_entropy, "mobilenet": F.cross_entropy, "densenet": F.cross_entropy,
        "lognet": F.nll_loss, "headnet": F.cross_entropy}
