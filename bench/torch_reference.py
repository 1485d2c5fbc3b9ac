"""PyTorch eager on this machine: Hugging Face transformers' modeling code on the same checkpoint.

The reference that issue 3's speed goal is stated against ("at least 4x PyTorch eager, batch for
batch"), measured here rather than quoted, so the ratio comes from one machine and one session.
Same shapes as `bench/model_bench.ts`: prefill of one prompt of each `--prefill` length; decode at
each `--batches` size, every sequence after the same 128-token prompt, `--steps` greedy steps timed
after one untimed warm-up step, with the KV cache (`DynamicCache`) as `generate` uses it.

    /tmp/hf5/bin/python bench/torch_reference.py --model /tmp/q3 --batches 1,8,32 --prefill 128,512
    python3 bench/torch_reference.py --model /tmp/q3 --dtype bfloat16 --device cuda   # on a GPU

`--greedy N` instead prints the greedy continuation (N tokens) of `--prompt-ids`, as JSON, to
compare with `deno task generate --prompt-ids ... --temperature 0 --ignore-eos --json`.
"""

import argparse
import json
import os
import platform
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache


def sync(dev: torch.device) -> None:
    """Waits for the device's queued work, so a timer read after it covers the work."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prefill", default="128,512")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--greedy", type=int, default=0)
    ap.add_argument("--prompt-ids", default="")
    ap.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default cpu)")
    args = ap.parse_args()

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval().to(dev)
    vocab = model.config.vocab_size

    if args.greedy:
        prompt = torch.tensor([[int(t) for t in args.prompt_ids.split(",")]], device=dev)
        model.generation_config.eos_token_id = None
        with torch.no_grad():
            out = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.greedy,
                do_sample=False, top_k=None, top_p=None, temperature=None, pad_token_id=0,
                output_logits=True, return_dict_in_generate=True,
            )
        gaps = [float(l[0].topk(2).values.diff().abs()) for l in out.logits]
        print(json.dumps({"token_ids": out.sequences[0, prompt.shape[1]:].tolist(), "top2_gaps": gaps}))
        return

    print(
        f"# torch {torch.__version__}, transformers {transformers.__version__}, {args.dtype}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; device {device_name(dev)}; model {args.model}"
    )
    with torch.no_grad():
        for n in [int(x) for x in args.prefill.split(",") if x]:
            ids = torch.randint(0, vocab, (1, n), device=dev)
            model(ids[:, :16])  # warm-up
            model(ids)  # warm-up at the timed shape (a GPU's first call at a shape pays for its kernels)
            sync(dev)
            t0 = time.perf_counter()
            model(ids)
            sync(dev)
            dt = time.perf_counter() - t0
            print(f"prefill {n} tokens: {n / dt:.2f} tok/s ({dt * 1000:.0f} ms)")
        for b in [int(x) for x in args.batches.split(",") if x]:
            prompt = torch.randint(0, vocab, (1, 128), device=dev).repeat(b, 1)
            cache = DynamicCache()
            logits = model(prompt, past_key_values=cache, use_cache=True).logits[:, -1]
            times = []
            for _ in range(args.steps + 1):
                t0 = time.perf_counter()
                nxt = logits.argmax(-1, keepdim=True)
                logits = model(nxt, past_key_values=cache, use_cache=True).logits[:, -1]
                sync(dev)
                times.append(time.perf_counter() - t0)
            dt = sum(times[1:])
            print(
                f"decode batch {b}: {b * args.steps / dt:.2f} tok/s "
                f"({dt / args.steps * 1000:.0f} ms/step, {args.steps} steps)"
            )


if __name__ == "__main__":
    main()
