"""A gated MLP (SwiGLU feed-forward), 32 tokens x 128 -> 256 -> 128, float32."""
from tvm.relax.frontend import nn


class GatedMLP(nn.Module):
    def __init__(self, d: int = 128, hidden: int = 256):
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.down(nn.op.silu(self.gate(x)) * self.up(x))


mod, _ = GatedMLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor((32, 128), "float32")}})
