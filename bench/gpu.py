"""GPU figures in one short run: inference and training tokens/s of the "original" configuration, fp32 and bf16, and
the CPU-vs-GPU max abs difference of all layers.

Random weights; sentences from UD English-EWT dev when ``../shared`` is beside the repo, else synthetic Zipf text.
* inference: ``BiLM`` over consecutive batches of ``--batch-size`` sentences, ``torch.inference_mode``; fp32 (TF32
  off) and bf16 autocast; tokens/s of real tokens; the max abs diff of bf16 vs fp32 on the first batch.
* training: ``Trainer`` steps (stream windows, ``--train-batch`` × 20, 8,192 sampled negatives, Adagrad) as
  ``elmokit train`` runs them, fp32; tokens/s of one direction.
* agreement: all layers of one padded batch on CUDA vs the CPU (fp32).

Run on a GPU machine: ``PYTHONPATH=src python bench/gpu.py [--preset original] [--seconds 20]`` (well under 5 minutes:
each measurement stops after ``--seconds``). Without CUDA it prints a JSON line saying so and exits 0. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).parent))


def sentences(n: int) -> list[list[str]]:
    from inference import EWT_DEV, read_conllu_forms

    if EWT_DEV.is_file():
        return read_conllu_forms(EWT_DEV, n)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    return [[words[min(int(rng.paretovariate(1.1)) - 1, 4999)] for _ in range(rng.randint(3, 40))] for _ in range(n)]


def inference(model, batches, dtype: torch.dtype | None, seconds: float) -> float:
    from elmokit import batch_to_ids

    device = next(model.parameters()).device
    ids = [batch_to_ids(b).to(device) for b in batches]
    n_tok, start = 0, None
    with torch.inference_mode(), torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        model(ids[0])
        torch.cuda.synchronize()
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < seconds:
            model(ids[i % len(ids)])
            n_tok += sum(len(s) for s in batches[i % len(ids)])
            i += 1
        torch.cuda.synchronize()
    return n_tok / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="original")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--train-batch", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"cuda": False, "note": "no CUDA device: nothing measured"}))
        return
    from elmokit import PRESETS, batch_to_ids
    from elmokit.modules.bilm import BiLM
    from elmokit.pretraining.trainer import TrainConfig, Trainer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    data = sentences(2000)
    batches = [data[i : i + args.batch_size] for i in range(0, len(data), args.batch_size)]
    cpu_model = BiLM(PRESETS[args.preset]()).eval()
    gpu_model = BiLM(PRESETS[args.preset]()).eval()
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model.cuda()
    result = {"cuda": True, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset}
    ids = batch_to_ids(batches[0][:16])
    with torch.inference_mode():
        ref = cpu_model(ids).layers
        got = gpu_model(ids.cuda()).layers.cpu()
        result["cpu_vs_gpu_max_abs_diff"] = float((ref - got).abs().max())
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf = gpu_model(ids.cuda()).layers.float().cpu()
        result["bf16_vs_fp32_max_abs_diff"] = float((bf - got).abs().max())
    result["inference_tokens_per_s_fp32"] = inference(gpu_model, batches, None, args.seconds)
    result["inference_tokens_per_s_bf16"] = inference(gpu_model, batches, torch.bfloat16, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("".join(" ".join(s) + "\n" for s in data * 5), encoding="utf-8")
        cfg = TrainConfig(
            train_files=[str(corpus)],
            out_dir=str(Path(tmp) / "run"),
            model=PRESETS[args.preset]().to_options(),
            batching="windows",
            batch_size=args.train_batch,
            unroll_steps=20,
            n_negative_samples=8192,
            max_steps=3,
            checkpoint_every=10_000,
            log_every=1,
            progress=False,
            device="cuda",
        )
        trainer = Trainer(cfg)
        trainer.train()  # warm-up steps
        steps = 3
        while True:
            trainer.config.max_steps = trainer.step + steps
            seconds = trainer.train(resume=True)["loop_seconds"]
            if seconds > args.seconds / 4 or steps >= 200:
                break
            steps *= 2
        result["train_tokens_per_s_fp32"] = steps * args.train_batch * 20 / seconds
        result["train_steps_timed"] = steps
    print(json.dumps(result))


if __name__ == "__main__":
    main()
