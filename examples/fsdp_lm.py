"""A small character-level language model trained with FSDP and bf16: each process holds 1/N of the parameters,
gradients and optimizer state, and computes in bfloat16.

The text is generated (sentences from a small grammar), so nothing is downloaded. ``FSDPStrategy`` makes each
transformer ``Block`` an FSDP group (gathered for its forward and backward, freed after), ``precision="bf16-mixed"``
computes with bfloat16 copies of the float32 shards, and ``trainer.predict`` continues a few prompts (each
generated character is one FSDP forward, on every rank alike).

    python examples/fsdp_lm.py --accelerator cpu --devices 2          # two CPU processes over gloo
    python examples/fsdp_lm.py --accelerator cuda --devices 8         # eight GPUs over nccl
    python examples/fsdp_lm.py --accelerator cpu --devices 2 --fast   # a tiny model, a few batches
"""

from __future__ import annotations

import argparse
import random

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tandem import Trainer, TrainingModule, seed_everything
from tandem.strategies import FSDPStrategy

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird"]
VERBS = ["sees", "likes", "follows", "paints", "finds", "carries"]
OBJECTS = ["the red ball", "a green box", "the moon", "an apple", "the river", "a blue kite"]
PLACES = ["in the garden", "at night", "by the sea", "on monday", "under the bridge"]


def corpus(sentences: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}."
        for _ in range(sentences)
    )


class Windows(Dataset):
    """Every ``length + 1`` characters of ``ids`` as (input, next-character target)."""

    def __init__(self, ids: torch.Tensor, length: int) -> None:
        self.ids, self.length = ids, length

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i * self.length : (i + 1) * self.length + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP: the unit FSDP shards and gathers."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, width))
        return x + self.mlp(self.norm2(x))


class CharLM(TrainingModule):
    """Args:
    vocab: characters in the alphabet.
    width: embedding width.
    depth: transformer blocks.
    heads: attention heads per block.
    context: the longest sequence the model reads.
    lr: AdamW's learning rate.
    """

    def __init__(
        self, vocab: int, width: int = 128, depth: int = 4, heads: int = 4, context: int = 64, lr: float = 3e-3
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def _loss(self, batch) -> torch.Tensor:
        ids, targets = batch
        return F.cross_entropy(self(ids).float().flatten(0, 1), targets.flatten())

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        """Greedy continuation of each prompt: one forward per new character, on every rank alike."""
        (ids,) = batch
        for _ in range(self.new_characters):
            next_id = self(ids[:, -self.hparams.context :])[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
        return ids

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="auto", help="cpu, cuda (or gpu), or auto")
    parser.add_argument("--devices", type=int, default=2, help="processes per machine")
    parser.add_argument("--max-epochs", type=int, default=3)
    parser.add_argument("--root-dir", default="runs/fsdp_lm")
    parser.add_argument("--fast", action="store_true", help="a tiny model and a few batches, to check the program runs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seed_everything(0)
    text = corpus(300 if args.fast else 6000)
    alphabet = sorted(set(text))
    ids = torch.tensor([alphabet.index(c) for c in text])
    size = dict(width=32, depth=2, heads=2, context=32) if args.fast else dict(width=128, depth=4, heads=4, context=64)
    split = int(0.9 * len(ids))
    train = DataLoader(Windows(ids[:split], size["context"]), batch_size=16, shuffle=True)
    val = DataLoader(Windows(ids[split:], size["context"]), batch_size=32)

    strategy = FSDPStrategy(auto_wrap_policy={Block})  # each Block its own group; the rest in the root group
    trainer = Trainer(
        strategy=strategy,
        accelerator=args.accelerator,
        devices=args.devices,
        precision="bf16-mixed",
        max_epochs=1 if args.fast else args.max_epochs,
        limit_train_batches=4 if args.fast else 1.0,
        limit_val_batches=2 if args.fast else 1.0,
        gradient_clip_val=1.0,
        default_root_dir=args.root_dir,
        log_every_n_steps=2 if args.fast else 20,
        enable_progress_bar=not args.fast,
    )
    model = CharLM(vocab=len(alphabet), **size)
    model.new_characters = 8 if args.fast else 40
    trainer.fit(model, train, val)
    val_loss = float(trainer.callback_metrics["val_loss"])  # each entry point (predict below) starts them empty
    # The parameters are DTensors: each rank's local part is its shard of the whole.
    local = sum(p.to_local().numel() for p in model.parameters())
    whole = sum(p.numel() for p in model.parameters())

    prompts = ["the cat ", "a small ", "my sist", "the rob"]
    width = min(len(p) for p in prompts)
    loader = DataLoader(
        TensorDataset(torch.tensor([[alphabet.index(c) for c in p[:width]] for p in prompts])), batch_size=2
    )
    continued = [row for batch in trainer.predict(model, loader) for row in batch.tolist()]
    if trainer.is_global_zero:
        print(f"parameters held by rank 0: {local} of {whole} ({trainer.world_size} processes)")
        print(f"validation loss: {val_loss:.3f}")
        for row in continued:
            print("generated:", repr("".join(alphabet[i] for i in row)))
        if args.fast:
            print(
                "--fast is a smoke test (a tiny model, 4 batches): it checks that the program runs; the validation "
                "loss and the generated text mean something after the full run (python examples/fsdp_lm.py without "
                "--fast, 3 epochs)."
            )


if __name__ == "__main__":
    main()
