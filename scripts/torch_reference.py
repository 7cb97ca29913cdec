"""The reference programs' models in PyTorch, exactly as the users' Python programs build them.

Used by tests/fixtures/make_state_dicts.py (state_dict names and shapes) and bench/torch_train.py
(the speed reference). Needs Debian's python3-torch.
"""
import torch.nn as nn


def lenet(num_classes=10):
    """Reference program A."""
    return nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Conv2d(20, 50, 5),
                         nn.ReLU(), nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(800, 128), nn.ReLU(),
                         nn.Linear(128, num_classes))


def mnist_cnn(num_classes=10):
    """Reference program C (the softmax lives in the loss)."""
    return nn.Sequential(nn.Conv2d(1, 20, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(20, 20, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(980, num_classes))


def linear(num_classes=10, in_features=784):
    """Reference program E's Linear, as softmax regression over the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))


def mlp(num_classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, num_classes))


class Residual(nn.Module):
    """d2l's Residual block, as reference program D uses it."""

    def __init__(self, cin, cout, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(cout, cout, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(cin, cout, kernel_size=1, stride=strides) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2d(cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return self.relu(y + x)


def resnet18(num_classes=10, in_channels=1):
    """Reference program D (d2l's 28x28 ResNet-18)."""
    def resnet_block(cin, cout, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(cin, cout, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(cout, cout))
        return nn.Sequential(*blk)

    net = nn.Sequential(nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
                        nn.BatchNorm2d(64), nn.ReLU())
    net.add_module("resnet_block1", resnet_block(64, 64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128, 2))
    net.add_module("resnet_block3", resnet_block(128, 256, 2))
    net.add_module("resnet_block4", resnet_block(256, 512, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net


class BasicBlock(nn.Module):
    """torchvision's BasicBlock (its module names and order): conv3x3-BN-ReLU-conv3x3-BN, plus a
    downsample (1x1 conv with the stride + BN) where the shape changes; add, ReLU."""
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet18_imagenet(num_classes=10):
    """Reference program B's model: torchvision's ResNet-18 (built here without torchvision,
    which Debian does not package with python3-torch: the same modules, names and order)."""
    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            chans = [64, 128, 256, 512]
            for i, c in enumerate(chans):
                cin = 64 if i == 0 else chans[i - 1]
                setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet18()


MODELS = {"lenet": lenet, "mnist-cnn": mnist_cnn, "mlp": mlp, "resnet18": resnet18, "linear": linear,
          "resnet18-imagenet": resnet18_imagenet}
