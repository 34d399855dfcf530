"""A pre-norm transformer block: 32 tokens, width 128, 4 heads, MLP 256, float32."""
from tvm.relax.frontend import nn

T, D, H, F = 32, 128, 4, 256


class Block(nn.Module):
    def __init__(self):
        self.norm1 = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.proj = nn.Linear(D, D, bias=False)
        self.norm2 = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, F)
        self.fc2 = nn.Linear(F, D)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        h = self.norm1(x)
        q, k, v = nn.op.split(self.qkv(h), 3, axis=-1)
        heads = lambda t: nn.op.permute_dims(nn.op.reshape(t, (T, H, D // H)), (1, 0, 2))  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        scores = nn.op.matmul(q, nn.op.permute_dims(k, (0, 2, 1))) * (1.0 / (D // H) ** 0.5)
        attn = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
        x = x + self.proj(nn.op.reshape(nn.op.permute_dims(attn, (1, 0, 2)), (T, D)))
        return x + self.fc2(nn.op.gelu(self.fc1(self.norm2(x))))


mod, _ = Block().export_tvm(spec={"forward": {"x": nn.spec.Tensor((T, D), "float32")}})
