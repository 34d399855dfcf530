"""A ResNet basic block: 1 x 32 x 28 x 28, two 3x3 convolutions with ReLU and the identity
shortcut, float32 (batch norm folded into the convolutions' bias, as at inference)."""
from tvm.relax.frontend import nn

C, S = 32, 28


class BasicBlock(nn.Module):
    def __init__(self):
        self.conv1 = nn.Conv2D(C, C, 3, padding=1, bias=True)
        self.conv2 = nn.Conv2D(C, C, 3, padding=1, bias=True)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        h = nn.op.relu(self.conv1(x))
        return nn.op.relu(self.conv2(h) + x)


mod, _ = BasicBlock().export_tvm(spec={"forward": {"x": nn.spec.Tensor((1, C, S, S), "float32")}})
