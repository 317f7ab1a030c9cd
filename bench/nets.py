"""PyTorch architectures the accuracy zoo exports to ONNX (bench only; needs torch).

Written small and plain so the exported graphs look like what apps ship:
depthwise and grouped convolutions, residual adds, squeeze-excitation, skip
concatenations, upsampling, and a decoder step that reads a KV cache.
Weights are random (fan-in scaled so activations neither vanish into
denormals nor blow up, which would distort the timing).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def init_weights(module: nn.Module) -> nn.Module:
    """Variance-preserving random weights and non-trivial BatchNorm statistics."""
    gen = torch.Generator().manual_seed(0)
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
            fan_in = m.weight[0].numel() if not isinstance(m, nn.ConvTranspose2d) else m.weight.shape[0]
            with torch.no_grad():
                m.weight.normal_(0.0, math.sqrt(2.0 / max(fan_in, 1)), generator=gen)
                if m.bias is not None:
                    m.bias.uniform_(-0.1, 0.1, generator=gen)
        elif isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.1, 0.1, generator=gen)
                m.running_var.uniform_(0.8, 1.2, generator=gen)
                m.weight.uniform_(0.8, 1.2, generator=gen)
                m.bias.uniform_(-0.1, 0.1, generator=gen)
    return module.eval()


def conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1, act: type[nn.Module] | None = nn.ReLU,
            dilation: int = 1) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, stride, padding=dilation * (k // 2), dilation=dilation, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


# --- MobileNetV2 -----------------------------------------------------------------------------------------------------

class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int, dilation: int = 1) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn(cin, hidden, 1, act=nn.ReLU6))
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6, dilation=dilation),
                   conv_bn(hidden, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


def _make_divisible(v: float, divisor: int = 8) -> int:
    return max(divisor, int(v + divisor / 2) // divisor * divisor)


MBV2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                 (6, 320, 1, 1))  # (expand, channels, repeats, stride)


def mobilenet_v2_features(width: float = 1.0, output_stride: int = 32) -> tuple[nn.Sequential, int, int]:
    """MobileNetV2 trunk; returns (features, channels at stride 4, output channels).

    With output_stride 16 the last stride-2 stage is dilated instead (DeepLabV3 style).
    """
    cin = _make_divisible(32 * width)
    layers: list[nn.Module] = [conv_bn(3, cin, 3, 2, act=nn.ReLU6)]
    stride_now, dilation, low_level_channels = 2, 1, cin
    for t, c, n, s in MBV2_SETTINGS:
        cout = _make_divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            if stride == 2 and stride_now >= output_stride:
                dilation, stride = dilation * 2, 1
            layers.append(InvertedResidual(cin, cout, stride, t, dilation=dilation if stride == 1 else 1))
            stride_now *= stride
            cin = cout
        if stride_now == 4:
            low_level_channels = cin
    return nn.Sequential(*layers), low_level_channels, cin


class MobileNetV2(nn.Module):
    def __init__(self, width: float = 1.0, classes: int = 1000) -> None:
        super().__init__()
        self.features, _, c = mobilenet_v2_features(width)
        last = _make_divisible(1280 * max(1.0, width))
        self.head = conv_bn(c, last, 1, act=nn.ReLU6)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.features(x))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- ResNet-18 -------------------------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(cin, cout, 3, stride)
        self.conv2 = conv_bn(cout, cout, 3, act=None)
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.down(x) if self.down is not None else x
        return F.relu(self.conv2(self.conv1(x)) + identity)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        blocks: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- EfficientNet-B0-like ------------------------------------------------------------------------------------------

class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(s))))


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn(cin, hidden, 1, act=nn.SiLU))
        layers += [conv_bn(hidden, hidden, k, stride, groups=hidden, act=nn.SiLU),
                   SqueezeExcite(hidden, max(1, cin // 4)),
                   conv_bn(hidden, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


EFFNET_B0 = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
             (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))  # (expand, kernel, stride, channels, repeats)


class EfficientNet(nn.Module):
    def __init__(self, width: float = 1.0, depth: float = 1.0, classes: int = 1000) -> None:
        super().__init__()
        cin = _make_divisible(32 * width)
        layers: list[nn.Module] = [conv_bn(3, cin, 3, 2, act=nn.SiLU)]
        for t, k, s, c, n in EFFNET_B0:
            cout = _make_divisible(c * width)
            for i in range(int(math.ceil(n * depth))):
                layers.append(MBConv(cin, cout, k, s if i == 0 else 1, t))
                cin = cout
        last = _make_divisible(1280 * width)
        layers.append(conv_bn(cin, last, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- Segmentation for background blur ----------------------------------------------------------------------------

class UNet(nn.Module):
    """A small U-Net: 4 downsamplings, transposed-conv upsampling, skip concatenation, 1-channel mask."""

    def __init__(self, base: int = 16) -> None:
        super().__init__()
        chans = [base, base * 2, base * 4, base * 8, base * 16]
        self.enc = nn.ModuleList()
        cin = 3
        for c in chans:
            self.enc.append(nn.Sequential(conv_bn(cin, c), conv_bn(c, c)))
            cin = c
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for c in reversed(chans[:-1]):
            self.up.append(nn.ConvTranspose2d(cin, c, 2, 2))
            self.dec.append(nn.Sequential(conv_bn(2 * c, c), conv_bn(c, c)))
            cin = c
        self.out = nn.Conv2d(cin, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, stage in enumerate(self.enc):
            x = stage(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips[:-1]), strict=True):
            x = dec(torch.cat([up(x), skip], dim=1))
        return torch.sigmoid(self.out(x))


class DeepLabLite(nn.Module):
    """DeepLabV3+-lite: MobileNetV2 (width 0.5, output stride 16), light ASPP, decoder, bilinear upsampling."""

    def __init__(self, width: float = 0.5, aspp: int = 64) -> None:
        super().__init__()
        features, low_c, high_c = mobilenet_v2_features(width, output_stride=16)
        self.low = features[:4]  # stride 4
        self.high = features[4:]
        self.aspp = nn.ModuleList([conv_bn(high_c, aspp, 1)] +
                                  [conv_bn(high_c, aspp, 3, groups=1, dilation=d) for d in (6, 12)])
        self.pool_proj = conv_bn(high_c, aspp, 1)
        self.project = conv_bn(4 * aspp, aspp, 1)
        self.low_proj = conv_bn(low_c, 24, 1)
        self.decode = nn.Sequential(conv_bn(aspp + 24, aspp, 3, groups=1), conv_bn(aspp, aspp, 3))
        self.out = nn.Conv2d(aspp, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        low = self.low(x)
        high = self.high(low)
        pooled = self.pool_proj(F.adaptive_avg_pool2d(high, 1)).expand(-1, -1, high.shape[2], high.shape[3])
        y = self.project(torch.cat([branch(high) for branch in self.aspp] + [pooled], dim=1))
        y = F.interpolate(y, size=low.shape[-2:], mode="bilinear", align_corners=False)
        y = self.decode(torch.cat([y, self.low_proj(low)], dim=1))
        y = F.interpolate(self.out(y), size=size, mode="bilinear", align_corners=False)
        return torch.sigmoid(y)


# --- MLP -------------------------------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, inputs: int, width: int, depth: int, outputs: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = inputs
        for _ in range(depth):
            layers += [nn.Linear(cin, width), nn.GELU()]
            cin = width
        layers.append(nn.Linear(cin, outputs))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# --- GPT decoder step with an explicit KV cache ----------------------------------------------------------------------

class CachedBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, s, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x, k, v


class CachedDecoder(nn.Module):
    """One decoding step of a GPT-2-like model: new token ids + past K/V per layer -> logits + present K/V."""

    def __init__(self, layers: int, dim: int, heads: int, vocab: int = 50257, positions: int = 2048) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(positions, dim)
        self.blocks = nn.ModuleList(CachedBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        past_len = past[0].shape[2]
        pos = torch.arange(past_len, past_len + input_ids.shape[1]).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(pos)
        present: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, past[2 * i], past[2 * i + 1])
            present += [k, v]
        return (self.lm_head(self.ln_f(x)), *present)
