"""Make the figures of docs/guides/logging.md from a real run: what a tandem fit writes for TensorBoard.

    python docs/scripts/render_tensorboard.py            # about 20 s on 2 CPU cores; needs matplotlib

It trains a small classifier three times (three learning rates) with `TensorBoardLogger(log_graph=True)`, reads
the event files back with TensorBoard's own `EventAccumulator`, and draws what TensorBoard's SCALARS, HPARAMS and
GRAPHS tabs show. These are renderings of the event files' contents, not screenshots of TensorBoard's UI (there
is no browser on the machine that builds the docs). The PNGs go to docs/images/.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import tandem  # noqa: E402
from tandem.loggers import TensorBoardLogger  # noqa: E402

IMAGES = Path(__file__).resolve().parents[1] / "images"
LEARNING_RATES = (0.03, 0.1, 0.3)


class Classifier(tandem.TrainingModule):
    """Four classes of 16 features; the example input makes TensorBoard's graph."""

    def __init__(self, lr: float = 0.1, hidden: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4))
        self.example_input_array = torch.zeros(2, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def train(root: Path) -> list[Path]:
    """One run per learning rate; returns their log folders."""
    folders = []
    for lr in LEARNING_RATES:
        tandem.seed_everything(0)
        x = torch.randn(1024, 16)
        data = TensorDataset(x, x[:, :4].argmax(1))
        trainer = tandem.Trainer(
            max_epochs=8,
            logger=TensorBoardLogger(root, log_graph=True),
            log_every_n_steps=4,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )
        trainer.fit(Classifier(lr=lr), DataLoader(data, batch_size=64, shuffle=True), DataLoader(data, batch_size=256))
        folders.append(Path(trainer.log_dir))
    return folders


def load(folder: Path) -> EventAccumulator:
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return events


def hparams_of(events: EventAccumulator) -> dict[str, float | str]:
    content = events.summary_metadata["_hparams_/session_start_info"].plugin_data.content
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {
        name: value.number_value if value.HasField("number_value") else value.string_value
        for name, value in start.hparams.items()
    }


def draw_scalars(runs: list[tuple[str, EventAccumulator]], out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(10, 3), dpi=90)
    for ax, tag in zip(axes, ("train_loss", "val_loss", "val_acc")):
        for name, events in runs:
            points = events.Scalars(tag)
            ax.plot(
                [p.step for p in points], [p.value for p in points], label=name, marker="." if "val" in tag else None
            )
        ax.set_title(tag, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("SCALARS: one curve per run (from the event files)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def draw_hparams(runs: list[tuple[str, EventAccumulator]], out: Path) -> None:
    names = sorted(hparams_of(runs[0][1]))
    metrics = ("train_loss", "val_loss", "val_acc")
    header = ["run", *names, *metrics]
    rows = []
    for name, events in runs:
        params = hparams_of(events)
        last = [f"{events.Scalars(m)[-1].value:.4f}" for m in metrics]
        rows.append([name, *(f"{params[p]:g}" if isinstance(params[p], float) else params[p] for p in names), *last])
    fig, ax = plt.subplots(figsize=(8, 1.5), dpi=90)
    ax.axis("off")
    table = ax.table(cellText=rows, colLabels=header, loc="center", cellLoc="center")
    table.scale(1, 1.4)
    ax.set_title("HPARAMS: each run's hyperparameters and the last value of its metrics", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def draw_graph(events: EventAccumulator, out: Path) -> None:
    """The traced graph's operations top to bottom, each arrow an input; parameters (GetAttr) as side notes."""
    graph = events.Graph()
    ops = [n for n in graph.node if n.op != "prim::GetAttr"]
    params = {n.name: n.name.split("/")[-1].split(".")[0] for n in graph.node if n.op == "prim::GetAttr"}
    fig, ax = plt.subplots(figsize=(7, 0.9 * len(ops) + 0.6), dpi=90)
    ax.axis("off")
    ys = {name: len(ops) - i for i, name in enumerate(_topological([n for n in ops]))}
    for node in ops:
        y = ys[node.name]
        scope = "/".join(node.name.split("/")[:-1]) or node.name
        ax.text(
            0.5,
            y,
            f"{node.op}\n{scope}",
            ha="center",
            va="center",
            fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "#fde2b8" if "IO" in node.op else "#cfe3f7"},
        )
        weights = [params[i] for i in node.input if i in params]
        if weights:
            ax.text(0.85, y, " + ".join(sorted(weights)), ha="left", va="center", fontsize=7, color="#555")
        for source in node.input:
            if source in ys:
                ax.annotate("", xy=(0.5, y + 0.3), xytext=(0.5, ys[source] - 0.3), arrowprops={"arrowstyle": "->"})
    ax.set_xlim(0, 1.2)
    ax.set_ylim(0.4, len(ops) + 0.6)
    ax.set_title("GRAPHS: the module traced with example_input_array", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def _topological(nodes) -> list[str]:
    """Node names, each after the nodes it takes as input (the order the module runs them)."""
    inputs = {n.name: [i for i in n.input if i in {m.name for m in nodes}] for n in nodes}
    order: list[str] = []
    while len(order) < len(nodes):
        ready = sorted(name for name, needs in inputs.items() if name not in order and all(i in order for i in needs))
        order.append(ready[0])
    return order


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=IMAGES)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        folders = train(Path(root))
        runs = [(f"{f.name} (lr={lr})", load(f)) for f, lr in zip(folders, LEARNING_RATES)]
        draw_scalars(runs, args.out / "tensorboard-scalars.png")
        draw_hparams(runs, args.out / "tensorboard-hparams.png")
        draw_graph(runs[0][1], args.out / "tensorboard-graph.png")
    for png in sorted(args.out.glob("tensorboard-*.png")):
        print(f"{png}: {png.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
