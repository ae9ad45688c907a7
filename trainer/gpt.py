"""The gpt task: a small byte-level decoder-only transformer trained on the Python standard
library's source, which every CPython install carries (whole modules held out for evaluation).

The corpus's SHA-256 is part of the task's identity, so a node or checkpoint with another
Python's text is refused. Why this corpus and tokenizer: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import math
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from torchjob.trainer.config import ConfigError

# Modules in every CPython 3.x from 3.8 on (none deprecated for removal), largest first; a
# name is NAME.py or the package NAME/__init__.py (pathlib is a package from 3.13).
TRAIN_MODULES = (
    "_pydecimal", "inspect", "typing", "pydoc", "tarfile", "doctest", "argparse", "_pyio",
    "pickletools", "zipfile", "datetime", "subprocess", "difflib", "locale", "enum",
    "mailbox", "ipaddress", "pickle", "pdb", "ast", "optparse", "dataclasses", "threading",
    "shutil", "configparser", "imaplib", "ssl", "pathlib", "statistics", "smtplib",
    "traceback", "os", "functools", "socket", "codecs", "ftplib", "random", "bdb", "tempfile",
    "_collections_abc", "ntpath", "pstats", "trace", "dis", "plistlib", "uuid",
    "socketserver", "contextlib", "tokenize", "_strptime", "pkgutil", "gzip", "mimetypes",
)
EVAL_MODULES = ("fractions", "pprint")  # held out: about 53 kB
VOCAB = 256  # byte-level


@dataclass(frozen=True)
class Corpus:
    train: bytes
    eval: bytes
    identity: str  # Python version and SHA-256 of the text: equal text, equal identity


def stdlib_corpus() -> Corpus:
    """The listed modules' bytes, each file followed by a newline, in the listed order."""
    root = Path(sysconfig.get_paths()["stdlib"])

    def read(names: tuple[str, ...]) -> bytes:
        parts = []
        for name in names:
            path = root / f"{name}.py"
            if not path.is_file():
                path = root / name / "__init__.py"
            try:
                parts.append(path.read_bytes() + b"\n")
            except OSError as exc:
                raise ConfigError(f"--task gpt reads the standard library's source, but "
                                  f"{root / name}.py cannot be read ({exc}); this Python "
                                  f"({platform.python_version()}) installs it without its "
                                  "sources: use a full CPython install") from None
        return b"".join(parts)

    train, held_out = read(TRAIN_MODULES), read(EVAL_MODULES)
    digest = hashlib.sha256(train + b"\0" + held_out).hexdigest()[:16]
    return Corpus(train, held_out, f"python-stdlib {platform.python_version()} "
                                   f"sha256:{digest}")


def windows(text: bytes, context: int) -> TensorDataset:
    """(inputs, targets) windows of ``context`` bytes at stride ``context``; targets are the
    inputs shifted by one byte."""
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    if len(data) < context + 1:
        raise ConfigError(f"--gpt-context {context} is longer than the text "
                          f"({len(data)} bytes): lower it")
    rows = data.unfold(0, context + 1, context)  # views of one tensor, no copy
    return TensorDataset(rows[:, :-1], rows[:, 1:])


def unigram_entropy(text: bytes) -> float:
    """Entropy of the byte frequencies, in nats: the loss of the best model that ignores
    context, the baseline a language model must beat."""
    counts = torch.bincount(torch.frombuffer(bytearray(text), dtype=torch.uint8).long(),
                            minlength=VOCAB).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


# -- the model: nanoGPT's shape (pre-norm blocks, no biases, GELU MLP), causal SDPA ----------

class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    """One transformer block: FSDP2 shards the model block by block (Task.shard_units)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=False)
        self.attn = SelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width, bias=False)
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and an output layer of
    its own (not tied to the embedding: 256 x width weights are cheap, and a state dict without
    aliases shards and reloads plainly)."""

    def __init__(self, *, layers: int, heads: int, width: int, context: int) -> None:
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width, bias=False)
        self.head = nn.Linear(width, VOCAB, bias=False)
        for name, p in self.named_parameters():  # GPT-2's initialisation, as nanoGPT's
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (batch, time, 256) for byte ids (batch, time)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))
