"""A Hugging Face `Trainer` run, unchanged under distprof: a tiny Llama built from a config (random weights) on
synthetic token batches; nothing is downloaded (HF_HUB_OFFLINE=1 works).

    torchrun --standalone --nproc_per_node=2 -m distprof.launch examples/hf_trainer.py --steps 12

The Trainer makes the process group itself (accelerate; gloo on CPU) and wraps the model in DDP; distprof's
optimizer-step hook sees each optimizer step (docs/frameworks.md).

Knobs:
  --slow-rank R --slow-ms X   rank R sleeps X ms at the start of every forward (stands in for slower device work)
  --base-ms X                 every rank sleeps X ms per forward (device time that does not use the host's CPU)
  --bucket-mb X               DDP gradient bucket size in MB (ddp_bucket_cap_mb; default: DDP's own)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12, help="optimizer steps (max_steps)")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps --slow-ms every forward")
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra milliseconds per forward on --slow-rank")
    p.add_argument("--base-ms", type=float, default=0.0, help="milliseconds every rank sleeps per forward")
    p.add_argument("--bucket-mb", type=float, default=None, help="DDP gradient bucket size in MB (ddp_bucket_cap_mb)")
    p.add_argument("--torch-compile", default=None, metavar="BACKEND",
                   help="the Trainer's torch_compile with this backend (inductor, or eager for quick tests)")
    return p.parse_args()


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, the labels the inputs (causal LM)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    args = parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=args.seq)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    sleep_s = (args.base_ms + (args.slow_ms if rank == args.slow_rank else 0.0)) / 1e3
    if sleep_s > 0:
        model.register_forward_pre_hook(lambda module, inputs: time.sleep(sleep_s))
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=1e-3,
            use_cpu=not torch.cuda.is_available(), ddp_backend=None if torch.cuda.is_available() else "gloo",
            report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
            ddp_bucket_cap_mb=args.bucket_mb, torch_compile=args.torch_compile is not None,
            torch_compile_backend=args.torch_compile)
        data = Tokens(args.steps * args.batch * world, args.seq, config.vocab_size)
        t0 = time.perf_counter()
        result = Trainer(model=model, args=targs, train_dataset=data).train()
    if rank == 0:
        print(f"hf_trainer: {result.global_step} steps on {world} rank(s) in {time.perf_counter() - t0:.2f} s, "
              f"loss {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
