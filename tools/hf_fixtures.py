"""Checkpoints written by Hugging Face transformers itself, and what transformers generates from them.

The engine's other tests load checkpoints that `tools/make_model.ts` writes. This script is the
independent check: it builds tiny random models with transformers' own classes, saves them with
`save_pretrained` (config.json, safetensors, optionally sharded with an index, generation_config.json),
trains a byte-level BPE tokenizer with the `tokenizers` library and saves it with transformers'
`PreTrainedTokenizerFast.save_pretrained` (tokenizer.json, tokenizer_config.json, chat template), and
records in `expected.json` what transformers' modeling code generates greedily
(`model.generate(do_sample=False)`, 32 new tokens, EOS ignored) with the raw logits' top-2 gap of
every step, the tokenizer's ids for a few texts and the rendered chat prompt.
`tests/hf_checkpoint_test.ts` loads these directories unchanged and must reproduce all of it.

Run it with transformers 5.x (writes `rope_parameters`) and 4.x (writes `rope_theta` /
`rope_scaling`); each run writes only the fixtures of its own major version:

    python -m venv /tmp/hf5 && /tmp/hf5/bin/pip install torch "transformers==5.18.0"
    python -m venv /tmp/hf4 && /tmp/hf4/bin/pip install torch "transformers==4.57.6"
    /tmp/hf5/bin/python tools/hf_fixtures.py tests/fixtures/hf
    /tmp/hf4/bin/python tools/hf_fixtures.py tests/fixtures/hf

The committed fixtures were written on 2026-11-22 by transformers 5.18.0 and 4.57.6 with torch
2.13.0+cpu. The offline package mirror there had no huggingface-hub < 1.0, which transformers 4.57
checks for at import; that check was disabled in the throwaway environment (nothing here touches the
Hub). Not part of the test run (CI has no Python); the fixtures it wrote are committed.
"""

import json
import os
import shutil
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    GPT2Config,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

MAJOR = int(transformers.__version__.split(".")[0])
NEW_TOKENS = 32
PROMPT_LENGTHS = (1, 7, 33)
VOCAB = 512  # model vocabulary; the tokenizer knows fewer ids (a padded vocabulary)
TOKENIZER_VOCAB = 400
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paged attention keeps the KV cache in fixed-size blocks, like pages of virtual memory.",
    "Continuous batching decides the batch again at every step of the engine.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "小型推理服务器先读取模型文件，然后一次生成一个词元。",
    "Emoji: 😀 🚀 ✨ and accents: café, naïve, Ωμέγα.",
]
TEXTS = [
    "Hello, world!",
    "Paged attention keeps the KV cache in blocks.",
    "小型推理服务器 😀 café",
    "  spaces\tand\nnewlines  ",
    "Yes . No , it 's fine !",
]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is paged attention?"},
]


def tokenizer_files(out: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def text_case(fast: PreTrainedTokenizerFast, text: str) -> dict:
    """A text, its ids, and transformers' decode of them (with its own clean-up default)."""
    ids = fast.encode(text, add_special_tokens=False)
    return {"text": text, "ids": ids, "decoded": fast.decode(ids)}


def configs():
    """(name, major, config, save dtype, shard size) of every fixture."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=2,
    )
    if MAJOR >= 5:
        rope = lambda theta, **extra: {"rope_parameters": {"rope_type": "default", "rope_theta": theta, **extra}}
        llama3 = {"rope_parameters": {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}
    else:
        rope = lambda theta: {"rope_theta": theta}
        llama3 = {"rope_theta": 500000.0, "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}}
    qwen3 = dict(common, head_dim=32, tie_word_embeddings=True, **rope(1000000.0))
    gpt2 = GPT2Config(
        vocab_size=VOCAB, n_positions=256, n_embd=64, n_layer=2, n_head=4,
        initializer_range=0.2, bos_token_id=0, eos_token_id=2,
    )
    if MAJOR >= 5:
        return [
            ("qwen3-f32", Qwen3Config(**qwen3), torch.float32, None),
            ("qwen3-bf16-sharded", Qwen3Config(**qwen3), torch.bfloat16, "150KB"),
            ("llama3-scaling-f16", LlamaConfig(**common, tie_word_embeddings=False, **llama3), torch.float16, None),
            ("gpt2-f32", gpt2, torch.float32, None),
        ]
    return [
        ("qwen2-f32-v4", Qwen2Config(**common, tie_word_embeddings=True, **rope(1000000.0)), torch.float32, None),
        ("llama3-scaling-f32-v4", LlamaConfig(**common, tie_word_embeddings=False, **llama3), torch.float32, None),
    ]


def main(root: str) -> None:
    os.makedirs(root, exist_ok=True)
    for name, config, dtype, shard in configs():
        out = os.path.join(root, name)
        shutil.rmtree(out, ignore_errors=True)
        torch.manual_seed(sum(map(ord, name)))
        model = AutoModelForCausalLM.from_config(config).eval()
        # Qwen2 initialises its q/k/v biases at zero: give them values, so they are tested.
        for module_name, param in model.named_parameters():
            if module_name.endswith("bias"):
                with torch.no_grad():
                    param.normal_(0.0, 0.2)
        model = model.to(dtype)
        model.generation_config = GenerationConfig(
            bos_token_id=0, eos_token_id=[2, 1], do_sample=True, temperature=0.7, top_p=0.9, top_k=20,
        )
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(out, **kwargs)
        fast = tokenizer_files(out)

        # What transformers computes: the saved weights, in float32.
        model = model.float()
        # Greedy, EOS ignored. (transformers 4.5x fills values a passed config leaves at their
        # defaults from the model's own generation config, so replace that, not just override.)
        model.generation_config = GenerationConfig(
            max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=1,
        )
        gen = torch.Generator().manual_seed(7)
        runs = []
        for length in PROMPT_LENGTHS:
            prompt = torch.randint(0, TOKENIZER_VOCAB, (1, length), generator=gen)
            with torch.no_grad():
                res = model.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            tokens = res.sequences[0, length:].tolist()
            gaps = []
            for step, logits in enumerate(res.logits):
                top = torch.topk(logits[0].double(), 2)
                assert int(top.indices[0]) == tokens[step], f"generate() was not greedy: {tokens} step {step} {top}"
                gaps.append(float(top.values[0] - top.values[1]))
            text = fast.decode(tokens, skip_special_tokens=True)
            runs.append({"prompt": prompt[0].tolist(), "tokens": tokens, "gaps": gaps, "text": text})
        expected = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "architecture": config.architectures[0] if config.architectures else type(model).__name__,
            "saved_dtype": str(dtype).replace("torch.", ""),
            "greedy": runs,
            "texts": [text_case(fast, t) for t in TEXTS],
            "chat": {
                "messages": MESSAGES,
                "prompt": fast.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
            },
        }
        with open(os.path.join(out, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(name, sorted(os.listdir(out)), "min gap", min(min(r["gaps"]) for r in runs))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf")
