"""A GPT-2-like decoder language model: the built-in workload whose scaling measures GPUs.

Pre-LN blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP ->
residual), learned position embeddings, a final LayerNorm and an lm head tied to the token
embedding by default, as GPT-2. Attention is torch's scaled_dot_product_attention with
is_causal=True (flash attention on H100). With GPT-2-small shapes (vocab 50304, seq 1024,
d_model 768, 12 layers, 12 heads, tied) it has 124,475,904 parameters (`n_params`) and
costs 854,654,976 training FLOPs per token (`flops_per_token`), 0.875 TFLOP per sequence.

FLOPs: torch's FlopCounterMode counts SDPA on the CUDA kernels (flash, efficient, cuDNN)
but not on the CPU kernel (`_scaled_dot_product_flash_attention_for_cpu`), where it counts 0.
The pipeline counts FLOPs on the CPU copy of the model after training (ddpscale.job.device.flops), so
importing this module registers the CPU kernel's formula, the same one torch uses for the
CUDA kernels (full attention, causality not discounted, as in the 12 x L x T x d term).
"""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter


def flops_per_token(vocab_size: int, seq_len: int, d_model: int, n_layers: int, mlp_ratio: int = 4,
                    tie_weights: bool = True) -> int:
    """Training FLOPs (forward + backward) per token: 6 x N_matmul + 12 x n_layers x seq_len x d_model.

    N_matmul counts the weights of every matrix multiply: per layer the qkv (3 d^2) and output
    (d^2) projections and the MLP (2 x mlp_ratio x d^2), and the lm head (d x vocab). Biases,
    LayerNorms and the embedding lookups are not matmuls. The lm head multiplies by a d x vocab
    matrix whether or not it shares its storage with the token embedding, so `tie_weights`
    changes the parameter count, not the FLOPs. The second term is attention's two batched
    matmuls (scores and weighted values: 4 T d per token forward, twice that backward) over
    the full T x T square, as torch's FlopCounterMode counts them (causal masking not discounted).
    """
    del tie_weights  # same FLOPs either way (see above); kept so the signature mirrors the model's
    per_layer = (4 + 2 * mlp_ratio) * d_model * d_model
    n_matmul = n_layers * per_layer + d_model * vocab_size
    return 6 * n_matmul + 12 * n_layers * seq_len * d_model


def flops_per_sample(vocab_size: int, seq_len: int, d_model: int, n_layers: int, mlp_ratio: int = 4,
                     tie_weights: bool = True) -> int:
    """Training FLOPs per sequence of seq_len tokens: the pipeline's unit (samples/s) is one sequence."""
    return seq_len * flops_per_token(vocab_size, seq_len, d_model, n_layers, mlp_ratio, tie_weights)


def n_params(vocab_size: int, seq_len: int, d_model: int, n_layers: int, mlp_ratio: int = 4,
             tie_weights: bool = True) -> int:
    """Parameters of TransformerLM with these shapes (GPT-2 small, tied: 124,475,904)."""
    hidden = mlp_ratio * d_model
    block = (2 * 2 * d_model  # two LayerNorms
             + d_model * 3 * d_model + 3 * d_model  # qkv
             + d_model * d_model + d_model  # attention output
             + d_model * hidden + hidden + hidden * d_model + d_model)  # MLP
    embeddings = vocab_size * d_model + seq_len * d_model
    head = 0 if tie_weights else d_model * vocab_size
    return embeddings + n_layers * block + 2 * d_model + head


# --- FlopCounterMode on the CPU attention kernel (see the module docstring) -------------------

def _attention_flops(query_shape, key_shape, value_shape, passes: int) -> int:
    b, h, s_q, d_q = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    # forward: q @ k^T and scores @ v (2 bmms); backward: 4 bmms (grads of scores, v, q, k)
    return passes * (2 * b * h * s_q * s_k * d_q + 2 * b * h * s_q * s_k * d_v)


def _register_cpu_attention_flops() -> None:
    aten = torch.ops.aten
    targets = {
        "_scaled_dot_product_flash_attention_for_cpu":
            lambda q, k, v, *args, out_shape=None, **kwargs: _attention_flops(q, k, v, 1),
        "_scaled_dot_product_flash_attention_for_cpu_backward":
            lambda grad, q, k, v, *args, out_shape=None, **kwargs: _attention_flops(q, k, v, 2),
    }
    for name, formula in targets.items():
        op = getattr(aten, name, None)
        if op is not None and op not in flop_counter.flop_registry:  # a later torch may count it itself
            flop_counter.register_flop_formula(op)(formula)


_register_cpu_attention_flops()


# --- the model --------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int, dropout: float):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc_out = nn.Linear(mlp_ratio * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.fc_out(F.gelu(self.fc(self.ln2(x)))))


class TransformerLM(pl.LightningModule):
    """Decoder-only LM on (x, y) batches of token ids, y = x shifted by one.

    training_step returns the mean next-token cross-entropy and logs nothing (a logged value
    costs a host sync per step on a GPU); validation/test log {val,test}_{loss,acc} with
    sync_dist, acc being next-token accuracy (argmax == y).
    """

    def __init__(self, vocab_size: int = 50304, seq_len: int = 1024, d_model: int = 768, n_layers: int = 12,
                 n_heads: int = 12, mlp_ratio: int = 4, dropout: float = 0.0, lr: float = 6e-4,
                 weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95), tie_weights: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        if len(betas) != 2:
            raise ValueError(f"betas must be two numbers, not {betas!r}")
        self.save_hyperparameters()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_ratio, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self._init_weights()
        if tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def _init_weights(self) -> None:
        """GPT-2's: N(0, 0.02) weights, zero biases, residual projections scaled by 1/sqrt(2 L)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.proj, block.fc_out):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.hparams.n_layers))

    def n_params(self) -> int:
        """Distinct parameters (a tied lm head is counted once)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> int:
        h = self.hparams
        return flops_per_token(h.vocab_size, h.seq_len, h.d_model, h.n_layers, h.mlp_ratio, h.tie_weights)

    def flops_per_sample(self) -> int:
        """Training FLOPs per sequence of seq_len tokens (a sample, in the pipeline's throughput)."""
        return self.hparams.seq_len * self.flops_per_token()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.hparams.seq_len:
            raise ValueError(f"a sequence of {t} tokens is longer than seq_len {self.hparams.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def _loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        # No self.log here: a logged value costs a host sync per step on a GPU.
        return self._loss(self(x), y)

    def _evaluate(self, batch, prefix: str) -> None:
        x, y = batch
        logits = self(x)
        acc = (logits.argmax(dim=-1) == y).float().mean()
        self.log(f"{prefix}_loss", self._loss(logits, y), sync_dist=True)
        self.log(f"{prefix}_acc", acc, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        """AdamW; weight decay on the matrices of the matmuls only, not on biases, LayerNorms
        or the embeddings (a tied lm head is the token embedding, so it is not decayed either)."""
        embeddings = {id(self.tok_emb.weight), id(self.pos_emb.weight)}
        decay, no_decay = [], []
        for p in self.parameters():
            if p.requires_grad:
                (decay if p.ndim >= 2 and id(p) not in embeddings else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": self.hparams.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        # fused kernels need the parameters on CUDA; Lightning moves the module before calling this
        return torch.optim.AdamW(groups, lr=self.hparams.lr, betas=tuple(self.hparams.betas),
                                 fused=self.device.type == "cuda")
