#!/usr/bin/env python
"""Train and export specmac's embedded tiny draft/target model pair.

Reproducible (fixed seeds, fixed file list, fixed data order, torch CPU) build of:

* a byte-level BPE tokenizer (HF ``tokenizers``) trained on Python standard-library sources,
* two Llama-architecture models (``transformers.LlamaForCausalLM``): a ~4.6M-parameter target
  and a ~1M-parameter draft, trained on the same token stream,
* exports in every format the backends load: a Hugging Face folder per role (safetensors in
  float16, config, tokenizer, generation config; loads in transformers and mlx-lm) and GGUF files
  (F16 written here with ``gguf.GGUFWriter``, Q8_0 made with ``llama_cpp.llama_model_quantize``),
* checks (tokenizer ids llama.cpp == HF; first-step logits torch fp32 vs llama.cpp vs mlx fp32),
  a greedy sample, a draft/target acceptance measurement, ``manifest.json`` (SHA-256 of every
  shipped weight/tokenizer file) and ``README.md``.

Usage (from the repository root)::

    python scripts/train_embedded.py                  # train + export everything (~25 min, 2 cores)
    python scripts/train_embedded.py --skip-train     # re-export from the saved fp32 checkpoints

Training checkpoints (fp32) go to ``--work-dir`` (default ``build/embedded``), not into the package.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
ASSETS = REPO / "specmac" / "assets"
EOT = "<|endoftext|>"
VOCAB_SIZE = 4096
SEQ_LEN = 512
SEED = 1234
N_THREADS = 2
VAL_EVERY = 20  # every 20th file (sorted order, offset VAL_OFFSET) is held out for validation
VAL_OFFSET = 7

# Packages of the standard library added to the sorted top-level *.py files. Any path with a
# component named "test" or "tests" is excluded (and site-packages is never walked).
PACKAGES = (
    "asyncio", "collections", "concurrent", "email", "html", "http", "importlib", "json",
    "logging", "urllib", "xml",
)

# Model shapes. hidden, intermediate and head_dim are multiples of 32 so that Q8_0/Q4_0
# quantize every tensor (block size 32) instead of silently falling back to F16.
MODELS = {
    "draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=64),
    "target": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}
# batch (sequences of SEQ_LEN), total training tokens, peak LR, warmup steps, eval interval
TRAIN = {
    "draft": dict(batch=8, tokens=2_000_000, lr=3e-3, warmup=40, eval_every=50),
    "target": dict(batch=8, tokens=1_400_000, lr=1.5e-3, warmup=40, eval_every=50),
}
VAL_TOKENS = 48 * SEQ_LEN  # fixed validation subset (first chunks of the held-out stream)
QUANTS = {"q8_0": 7}  # llama_ftype values (LLAMA_FTYPE_MOSTLY_Q8_0 = 7, Q4_0 = 2)

SNIPPETS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\nclass Config(object):\n    \"\"\"Settings.\"\"\"\n",
    "    for i, x in enumerate(items):\n        if x is None:\n            continue\n",
    "raise ValueError(f'bad value: {value!r}')  # comment with ünïcödé and 日本語\n",
    f"x = 1{EOT}def f():\n\treturn {{'a': [1, 2.5e-3]}}\r\n",
]
ACCEPT_PROMPTS = [
    "def fibonacci(n):\n",
    "import os\n\n\ndef main(argv):\n",
    "class Queue:\n    def __init__(self, maxsize=0):\n",
    "    try:\n        value = self._cache[key]\n",
]


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------- corpus

def stdlib_dir() -> Path:
    import sysconfig
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files() -> list[str]:
    """Deterministic list of corpus files, relative to the stdlib directory."""
    root = stdlib_dir()
    files = sorted(p.name for p in root.glob("*.py"))
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            rel = p.relative_to(root)
            if any(part in ("test", "tests", "site-packages") for part in rel.parts):
                continue
            files.append(rel.as_posix())
    return files


def split_files(files):
    train, val = [], []
    for i, f in enumerate(files):
        (val if i % VAL_EVERY == VAL_OFFSET else train).append(f)
    return train, val


def read_docs(files):
    root = stdlib_dir()
    return [(root / f).read_bytes().decode("utf-8") for f in files]


# --------------------------------------------------------------------------- tokenizer

def train_tokenizer(train_docs):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_docs, trainer=trainer, length=len(train_docs))
    assert tok.token_to_id(EOT) == 0 and tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    return tok


def encode_stream(tok, docs):
    """Documents joined as EOT doc EOT doc ... EOT (EOT is BOS and EOS)."""
    eot = tok.token_to_id(EOT)
    out = [eot]
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.extend(enc.ids)
        out.append(eot)
    return np.asarray(out, dtype=np.int64)


# --------------------------------------------------------------------------- models

def llama_config(role):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=VOCAB_SIZE, max_position_embeddings=SEQ_LEN, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
        pad_token_id=0, hidden_act="silu", attention_bias=False, mlp_bias=False,
        initializer_range=0.02, **MODELS[role])


def evaluate(model, val):
    import torch
    model.eval()
    n = len(val) // (SEQ_LEN + 1)
    chunks = torch.from_numpy(val[: n * (SEQ_LEN + 1)].reshape(n, SEQ_LEN + 1))
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, 8):
            x = chunks[i:i + 8]
            logits = model(input_ids=x[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
            tot += loss.item()
            cnt += x[:, 1:].numel()
    model.train()
    return tot / cnt


def train_model(role, train, val, work):
    import torch
    from transformers import LlamaForCausalLM

    hp = TRAIN[role]
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(llama_config(role))
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[{role}] params={n_params:,} config={MODELS[role]} train={hp}")

    # fixed data order: non-overlapping windows of SEQ_LEN+1 tokens, shuffled per epoch with a
    # seeded numpy generator
    n_chunks = (len(train) - 1) // SEQ_LEN
    starts = np.arange(n_chunks) * SEQ_LEN
    rng = np.random.default_rng(SEED)
    bs = hp["batch"]
    steps = hp["tokens"] // (bs * SEQ_LEN)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < hp["warmup"]:
            return hp["lr"] * (step + 1) / hp["warmup"]
        t = (step - hp["warmup"]) / max(1, steps - hp["warmup"])
        return hp["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    order = rng.permutation(n_chunks)
    pos = 0
    history = []
    t0 = time.time()
    run_loss = None
    for step in range(steps):
        if pos + bs > len(order):
            order = rng.permutation(n_chunks)
            pos = 0
        idx = starts[order[pos:pos + bs]]
        pos += bs
        batch = torch.from_numpy(np.stack([train[s:s + SEQ_LEN + 1] for s in idx]))
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_loss = loss.item() if run_loss is None else 0.95 * run_loss + 0.05 * loss.item()
        if (step + 1) % hp["eval_every"] == 0 or step + 1 == steps:
            vl = evaluate(model, val)
            el = time.time() - t0
            history.append({"step": step + 1, "tokens": (step + 1) * bs * SEQ_LEN,
                            "train_loss": round(run_loss, 4), "val_loss": round(vl, 4),
                            "elapsed_s": round(el, 1)})
            log(f"[{role}] step {step + 1}/{steps} train {run_loss:.3f} val {vl:.3f} "
                f"lr {lr_at(step):.2e} {el:.0f}s ({(step + 1) * bs * SEQ_LEN / el:.0f} tok/s)")
    info = {"params": n_params, "steps": steps, "tokens": steps * bs * SEQ_LEN,
            "val_loss": history[-1]["val_loss"], "train_seconds": round(time.time() - t0, 1),
            "history": history, "hparams": hp}
    out = work / role
    model.save_pretrained(out)  # fp32 checkpoint (not shipped)
    (out / "train_info.json").write_text(json.dumps(info, indent=1))
    return info


# --------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work-dir", type=Path, default=REPO / "build" / "embedded",
                    help="where fp32 checkpoints and the tokenizer are kept (not shipped)")
    ap.add_argument("--skip-train", action="store_true",
                    help="reuse the tokenizer and fp32 checkpoints in --work-dir")
    ap.add_argument("--threads", type=int, default=N_THREADS)
    args = ap.parse_args(argv)

    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)

    files = corpus_files()
    train_files, val_files = split_files(files)
    train_docs, val_docs = read_docs(train_files), read_docs(val_files)
    log(f"corpus: {len(files)} files ({len(train_files)} train, {len(val_files)} val), "
        f"{sum(map(len, train_docs)):,} / {sum(map(len, val_docs)):,} chars")

    from tokenizers import Tokenizer
    tok_path = work / "tokenizer.json"
    if args.skip_train:
        tok = Tokenizer.from_file(str(tok_path))
    else:
        t0 = time.time()
        tok = train_tokenizer(train_docs)
        tok.save(str(tok_path))
        log(f"tokenizer trained in {time.time() - t0:.1f}s")
    train = encode_stream(tok, train_docs)
    val = encode_stream(tok, val_docs)
    log(f"tokens: train {len(train):,} val {len(val):,} "
        f"({sum(map(len, train_docs)) / len(train):.2f} chars/token)")
    val_eval = val[:VAL_TOKENS + VAL_TOKENS // SEQ_LEN]
    corpus = {"files": files, "train_files": train_files, "val_files": val_files,
              "train_tokens": int(len(train)), "val_tokens": int(len(val)),
              "val_eval_tokens": int(len(val_eval))}
    (work / "corpus.json").write_text(json.dumps(corpus, indent=1))

    infos = {}
    for role in ("draft", "target"):
        if args.skip_train:
            infos[role] = json.loads((work / role / "train_info.json").read_text())
        else:
            infos[role] = train_model(role, train, val_eval, work)
    export_all(tok, infos, corpus, work, args.threads)


if __name__ == "__main__":
    main()
