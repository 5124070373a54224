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
    # the draft's 2M-token schedule is cut at step 200 (0.82M tokens): trained to the end it
    # reached a lower validation loss (4.41) than the target (4.66) in this compute budget
    "draft": dict(batch=8, tokens=2_000_000, lr=3e-3, warmup=40, eval_every=50, stop_at=200),
    "target": dict(batch=4, tokens=1_800_000, lr=3e-3, warmup=40, eval_every=110),
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


def train_model(role, train, val, work, stop_at=None):
    import torch
    from transformers import LlamaForCausalLM

    hp = TRAIN[role]
    stop_at = stop_at or hp.get("stop_at")
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
    for _name, p in model.named_parameters():
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
            # latest checkpoint, so that a run cut short can still be exported with
            # --skip-train --from-checkpoint (and reproduced with --stop-at STEP)
            ck = work / f"{role}-checkpoint"
            model.save_pretrained(ck)
            (ck / "train_info.json").write_text(json.dumps(
                {"params": n_params, "steps": step + 1, "planned_steps": steps,
                 "tokens": (step + 1) * bs * SEQ_LEN, "val_loss": history[-1]["val_loss"],
                 "train_seconds": round(el, 1), "history": history, "hparams": hp}, indent=1))
            if stop_at and step + 1 >= stop_at:
                break
    steps_done = history[-1]["step"]
    info = {"params": n_params, "steps": steps_done, "planned_steps": steps,
            "tokens": steps_done * bs * SEQ_LEN,
            "val_loss": history[-1]["val_loss"], "train_seconds": round(time.time() - t0, 1),
            "history": history, "hparams": hp}
    out = work / role
    model.save_pretrained(out)  # fp32 checkpoint (not shipped)
    (out / "train_info.json").write_text(json.dumps(info, indent=1))
    return info



# --------------------------------------------------------------------------- exports

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": EOT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": SEQ_LEN,
        "added_tokens_decoder": {"0": {"content": EOT, "lstrip": False, "normalized": False,
                                       "rstrip": False, "single_word": False, "special": True}},
    }


def export_hf(role, tok, work):
    """HF folder: fp16 safetensors (tied embeddings), config, generation config, tokenizer."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    out = ASSETS / role
    if out.exists():
        shutil.rmtree(out)
    model = LlamaForCausalLM.from_pretrained(work / role, dtype=torch.float32)
    model = model.to(torch.float16)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    return out


def export_gguf_f16(role, hf_dir: Path, path: Path):
    """F16 GGUF of the HF folder, written by the package's writer (specmac.backends.conversion.hf_to_gguf,
    which tests/test_convert.py checks byte for byte against the shipped files)."""
    from specmac.backends.conversion.hf_to_gguf import write_gguf

    return write_gguf(hf_dir, path, name=f"specmac-embedded-{role}",
                      description="specmac embedded tiny model trained on CPython 3.11 stdlib sources",
                      license="PSF-2.0 (training data); see specmac/assets/README.md")


def quantize_gguf(src: Path, dst: Path, ftype: int, threads: int):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.pure = True  # every 2D tensor (incl. the tied embedding/LM head) gets the same type
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}) failed: rc={rc}")
    return dst


def gguf_tensor_types(path: Path):
    import gguf
    r = gguf.GGUFReader(str(path))
    return sorted({t.tensor_type.name for t in r.tensors if len(t.shape) > 1})


# --------------------------------------------------------------------------- checks

def hf_tokenizer(role):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(ASSETS / role))


def torch_model(role):
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(str(ASSETS / role), dtype=torch.float32)
    m.eval()
    return m


def torch_logits(model, ids):
    import torch
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].double().numpy()


def llama(path: Path, threads: int, **kw):
    from llama_cpp import Llama
    return Llama(model_path=str(path), n_ctx=SEQ_LEN, n_threads=threads,
                 n_threads_batch=threads, verbose=False, **kw)


def check_tokenizers(threads, texts):
    hf = hf_tokenizer("target")
    lc = llama(ASSETS / "target-f16.gguf", threads, vocab_only=True)
    results = []
    for t in texts:
        a = hf.encode(t, add_special_tokens=False)
        b = lc.tokenize(t.encode("utf-8"), add_bos=False, special=True)
        results.append({"chars": len(t), "tokens": len(a), "equal": a == b})
        if a != b:
            log("TOKENIZER MISMATCH", repr(t[:80]), a[:20], b[:20])
    return results


def check_logits(role, threads, prompt):
    import mlx.core as mx
    import mlx_lm

    tok = hf_tokenizer(role)
    ids = tok.encode(prompt, add_special_tokens=False)
    ref = torch_logits(torch_model(role), ids)[-1]
    out = {"prompt": prompt, "n_tokens": len(ids), "torch_fp32_argmax": int(ref.argmax())}
    for quant in ("f16",) + tuple(QUANTS):
        lc = llama(ASSETS / f"{role}-{quant}.gguf", threads, logits_all=True)
        lc.eval(ids)
        lg = np.asarray(lc.scores[len(ids) - 1], dtype=np.float64)
        out[f"llama_{quant}"] = {"max_abs_diff": float(np.abs(lg - ref).max()),
                                 "argmax": int(lg.argmax())}
        del lc
    model, mtok = mlx_lm.load(str(ASSETS / role))
    assert mtok.encode(prompt, add_special_tokens=False) == ids
    model.set_dtype(mx.float32)
    lg = np.asarray(model(mx.array([ids]))[0, -1].astype(mx.float32), dtype=np.float64)
    out["mlx_fp32"] = {"max_abs_diff": float(np.abs(lg - ref).max()), "argmax": int(lg.argmax())}
    out["logit_range"] = [float(ref.min()), float(ref.max())]
    return out


def greedy(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(torch_logits(model, ids[-SEQ_LEN:])[-1].argmax()))
    return ids


def probs_at(logits, temperature):
    if temperature == 0:
        p = np.zeros_like(logits)
        p[logits.argmax()] = 1.0
        return p
    z = logits / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def speculative_acceptance(draft, target, tok, prompts, k, temperature, n_new, seed):
    """Plain numpy speculative sampling (Leviathan et al. / Chen et al. rejection rule) with
    torch fp32 models, no KV cache. Returns accepted/drafted and mean tokens per target pass."""
    rng = np.random.default_rng(seed)
    drafted = accepted = steps = emitted = 0
    for prompt in prompts:
        ids = tok.encode(prompt, add_special_tokens=False)
        gen = 0
        while gen < n_new:
            ctx, qs, ds = list(ids), [], []
            for _ in range(k):
                q = probs_at(torch_logits(draft, ctx[-SEQ_LEN:])[-1], temperature)
                d = int(q.argmax()) if temperature == 0 else int(rng.choice(len(q), p=q))
                ds.append(d)
                qs.append(q)
                ctx.append(d)
            full = ids + ds
            lp = torch_logits(target, full[-SEQ_LEN:])[-(k + 1):]
            ps = [probs_at(row, temperature) for row in lp]
            n_acc = 0
            for j in range(k):
                d = ds[j]
                if temperature == 0:
                    ok = d == int(ps[j].argmax())
                else:
                    ok = rng.random() < min(1.0, ps[j][d] / qs[j][d])
                if not ok:
                    break
                n_acc += 1
            if n_acc < k:
                if temperature == 0:
                    nxt = int(ps[n_acc].argmax())
                else:
                    r = np.maximum(ps[n_acc] - qs[n_acc], 0.0)
                    r = r / r.sum() if r.sum() > 0 else ps[n_acc]
                    nxt = int(rng.choice(len(r), p=r))
            else:
                nxt = int(rng.choice(len(ps[k]), p=ps[k])) if temperature else int(ps[k].argmax())
            ids = ids + ds[:n_acc] + [nxt]
            gen += n_acc + 1
            drafted += k
            accepted += n_acc
            steps += 1
            emitted += n_acc + 1
    return {"K": k, "temperature": temperature, "drafted": drafted, "accepted": accepted,
            "acceptance": round(accepted / drafted, 4), "target_passes": steps,
            "tokens_per_target_pass": round(emitted / steps, 3), "tokens": emitted}


def teacher_forced_agreement(draft, target, val):
    """Per-position acceptance on held-out text: T=1 alpha = E[sum_x min(p, q)],
    T=0 alpha = P(argmax q == argmax p)."""
    n = 8
    chunks = val[: n * (SEQ_LEN + 1)].reshape(n, SEQ_LEN + 1)
    mins, agree = [], []
    for c in chunks:
        lp = torch_logits(target, c[:-1].tolist())
        lq = torch_logits(draft, c[:-1].tolist())
        p = np.exp(lp - lp.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        q = np.exp(lq - lq.max(-1, keepdims=True))
        q /= q.sum(-1, keepdims=True)
        mins.append(np.minimum(p, q).sum(-1))
        agree.append(lp.argmax(-1) == lq.argmax(-1))
    return {"positions": int(n * SEQ_LEN),
            "alpha_T1": round(float(np.concatenate(mins).mean()), 4),
            "alpha_T0": round(float(np.concatenate(agree).mean()), 4)}


def core_acceptance(threads, n_new=64):
    """The same measurement through specmac's own loop (torch backend, fp32) when the package
    core is importable; an error is recorded instead of failing the build."""
    try:
        sys.path.insert(0, str(REPO))
        from specmac.api import Pair
        from specmac.core.sampling import SamplingParams

        opts = {"device": "cpu", "dtype": "float32", "n_threads": threads}
        pair = Pair.load("torch", "torch", target_model=str(ASSETS / "target"),
                         draft_model=str(ASSETS / "draft"), target_options=dict(opts),
                         draft_options=dict(opts))
        out = []
        for temperature in (0.0, 1.0):
            drafted = accepted = tokens = 0
            for i, prompt in enumerate(ACCEPT_PROMPTS):
                g = pair.generate(prompt, params=SamplingParams(temperature=temperature),
                                  max_tokens=n_new, k=4, seed=SEED + i)
                drafted += g.stats.n_drafted
                accepted += g.stats.n_accepted
                tokens += len(g.token_ids)
            out.append({"K": 4, "temperature": temperature, "drafted": drafted,
                        "accepted": accepted, "tokens": tokens,
                        "acceptance": round(accepted / drafted, 4) if drafted else None})
        return out
    except Exception as e:  # the core is developed alongside; never block the asset build
        return {"error": f"{type(e).__name__}: {e}"}


# --------------------------------------------------------------------------- export driver

def export_all(tok, infos, corpus, work, threads):
    import gguf  # noqa: F401
    import llama_cpp
    import mlx.core as mx
    import mlx_lm
    import tokenizers
    import torch
    import transformers

    ASSETS.mkdir(parents=True, exist_ok=True)
    for old in ASSETS.glob("*.gguf"):
        old.unlink()
    for role in ("draft", "target"):
        hf = export_hf(role, tok, work)
        f16 = export_gguf_f16(role, hf, ASSETS / f"{role}-f16.gguf")
        for quant, ftype in QUANTS.items():
            quantize_gguf(f16, ASSETS / f"{role}-{quant}.gguf", ftype, threads)
        log(f"[{role}] exported; gguf tensor types:",
            {q: gguf_tensor_types(ASSETS / f"{role}-{q}.gguf") for q in ("f16",) + tuple(QUANTS)})

    # ---- checks
    val_docs = read_docs(corpus["val_files"])
    texts = SNIPPETS + [d[:3000] for d in val_docs[:5]]
    tok_check = check_tokenizers(threads, texts)
    assert all(r["equal"] for r in tok_check), tok_check
    log("tokenizer check: llama.cpp == HF on", len(texts), "texts")
    logit_check = {role: check_logits(role, threads, "def fibonacci(n):\n")
                   for role in ("draft", "target")}
    log("logit check:", json.dumps(logit_check, indent=1))

    hf_tok = hf_tokenizer("target")
    target, draft = torch_model("target"), torch_model("draft")
    prompt = "def fibonacci(n):\n"
    p_ids = hf_tok.encode(prompt, add_special_tokens=False)
    sample_ids = greedy(target, p_ids, 96)
    sample = hf_tok.decode(sample_ids)
    draft_sample = hf_tok.decode(greedy(draft, p_ids, 48))
    log("greedy target sample:\n" + sample)
    lc = llama(ASSETS / "target-f16.gguf", threads, logits_all=True)
    lc_ids = list(p_ids)
    lc.eval(lc_ids)
    for _ in range(32):
        nxt = int(np.argmax(lc.scores[len(lc_ids) - 1]))
        lc_ids.append(nxt)
        lc.eval([nxt])
    greedy_match = sum(a == b for a, b in zip(lc_ids[len(p_ids):],
                                              sample_ids[len(p_ids):len(p_ids) + 32]))
    del lc

    val_stream = encode_stream(tok, val_docs)
    tf = teacher_forced_agreement(draft, target, val_stream)
    log("teacher-forced agreement on validation text:", tf)
    acc = [speculative_acceptance(draft, target, hf_tok, ACCEPT_PROMPTS, 4, t, 64, SEED)
           for t in (0.0, 1.0)]
    log("speculative acceptance:", acc)
    core_acc = core_acceptance(threads)
    log("specmac core acceptance:", core_acc)

    manifest = {
        "format": 1,
        "roles": ["draft", "target"],
        "gguf_types": ["f16"] + list(QUANTS),
        "tokenizer": {"vocab_size": VOCAB_SIZE, "bos": EOT, "eos": EOT, "bos_id": 0,
                      "eos_id": 0, "add_bos_token": False},
        "files": {},
    }
    for f in sorted(ASSETS.rglob("*")):
        rel = f.relative_to(ASSETS).as_posix()
        if f.is_file() and f.suffix not in (".py", ".md", ".pyc") and rel != "manifest.json" \
                and "__pycache__" not in rel:
            manifest["files"][rel] = {"bytes": f.stat().st_size, "sha256": sha256(f)}
    (ASSETS / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "llama_cpp_python": llama_cpp.__version__, "mlx": mx.__version__,
           "mlx_lm": mlx_lm.__version__, "numpy": np.__version__,
           "platform": platform.platform(), "threads": threads}
    report = {"env": env, "corpus": {k: v for k, v in corpus.items()}, "train": infos,
              "tokenizer_check": tok_check, "logits": logit_check, "sample": sample,
              "draft_sample": draft_sample, "llama_greedy_match_32": greedy_match,
              "teacher_forced": tf, "acceptance": acc, "core_acceptance": core_acc}
    (work / "report.json").write_text(json.dumps(report, indent=1))
    write_readme(report, manifest)
    log("done; assets total",
        sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file()), "bytes")


def write_readme(r, manifest):
    lines = []
    A = lines.append
    env, corpus = r["env"], r["corpus"]
    A("# specmac embedded model pair")
    A("")
    A("A tiny draft/target pair of Llama-architecture models sharing one byte-level BPE "
      "tokenizer, shipped so that `specmac` runs with no download. They write Python-looking "
      "code and nothing else; they exist to exercise and measure the speculative-decoding "
      "machinery (acceptance is meaningful because both were trained on the same data).")
    A("")
    A("**Generated by `scripts/train_embedded.py`; do not edit by hand.**")
    A("")
    A("## Rebuild")
    A("")
    A("```sh")
    A("python scripts/train_embedded.py            # tokenizer + both models + all exports + this README")
    A("python scripts/train_embedded.py --skip-train   # re-export from build/embedded checkpoints")
    A("python scripts/train_embedded.py --roles target  # retrain one role, reuse the other")
    A("```")
    A("")
    A("Each role's training depends only on its own seed, hyperparameters and the token "
      "stream, so per-role runs (`--roles`) give the same models as one full run; the shipped "
      "files came from `--roles draft`-equivalent and `--roles target` runs followed by the "
      "export. Takes about 25 minutes on 2 CPU cores; fp32 checkpoints stay in `build/embedded` "
      "(git-ignored).")
    A("")
    A(f"Fixed seeds (`torch.manual_seed({SEED})`, numpy `default_rng({SEED})`), fixed file list and "
      f"data order, torch CPU with `torch.set_num_threads({env['threads']})`. Built with Python "
      f"{env['python']}, torch {env['torch']}, transformers {env['transformers']}, tokenizers "
      f"{env['tokenizers']}, llama-cpp-python {env['llama_cpp_python']}, mlx {env['mlx']}, mlx-lm "
      f"{env['mlx_lm']}, numpy {env['numpy']} on {env['platform']}. Bit-identical weights need the "
      "same torch build, CPU ISA and thread count; other setups give statistically equivalent models.")
    A("")
    A("## Corpus and licence")
    A("")
    A(f"Source files of the CPython {env['python']} standard library "
      "(`sysconfig.get_paths()['stdlib']`), licensed under the Python Software Foundation "
      "License 2.0 (PSF-2.0); the models are trained on them and reproduce their style. "
      "Files: all top-level `*.py`, sorted, then every `*.py` (sorted, recursively) in the "
      f"packages {', '.join('`' + p + '`' for p in PACKAGES)}, skipping any path with a "
      "`test`/`tests` component; `site-packages` is never read. "
      f"{len(corpus['files'])} files; every {VAL_EVERY}th file of that list (index % {VAL_EVERY} "
      f"== {VAL_OFFSET}) is held out for validation ({len(corpus['val_files'])} files). "
      "Documents are joined as `<|endoftext|> doc <|endoftext|> doc ... <|endoftext|>`.")
    A("")
    A(f"Train tokens: {corpus['train_tokens']:,}; validation tokens: {corpus['val_tokens']:,} "
      f"(validation loss is measured on the first {corpus['val_eval_tokens']:,}).")
    A("")
    A("Validation files: " + ", ".join(f"`{f}`" for f in corpus["val_files"]) + ".")
    A("")
    A("<details><summary>All corpus files, in order</summary>")
    A("")
    A("```")
    A(" ".join(corpus["files"]))
    A("```")
    A("</details>")
    A("")
    A("## Tokenizer")
    A("")
    A(f"HF `tokenizers` byte-level BPE (ByteLevel pre-tokenizer with the GPT-2 regex, ByteLevel "
      f"decoder), vocabulary {VOCAB_SIZE} including one special token `<|endoftext|>` (id 0) "
      "used as BOS, EOS and pad. No BOS/EOS is added automatically (`add_bos_token: false`, "
      "same in GGUF `tokenizer.ggml.add_bos_token`). In GGUF: `tokenizer.ggml.model = gpt2`, "
      "`tokenizer.ggml.pre = gpt-2` (llama.cpp's name for the GPT-2 regex).")
    A("")
    A("## Models")
    A("")
    A("| role | hidden | layers | heads (kv) | head_dim | intermediate | params | tokens seen | "
      "train time | val loss (nats/token) |")
    A("|---|---|---|---|---|---|---|---|---|---|")
    for role in ("draft", "target"):
        m, t = MODELS[role], r["train"][role]
        A(f"| {role} | {m['hidden_size']} | {m['num_hidden_layers']} | "
          f"{m['num_attention_heads']} ({m['num_key_value_heads']}) | {m['head_dim']} | "
          f"{m['intermediate_size']} | {t['params']:,} | {t['tokens']:,} | "
          f"{t['train_seconds'] / 60:.1f} min | {t['val_loss']:.3f} |")
    A("")
    A(f"Common: vocab {VOCAB_SIZE}, context {SEQ_LEN} (trained at sequence length {SEQ_LEN}), "
      "RoPE theta 10000, RMSNorm eps 1e-5, SiLU gated MLP, tied input/output embeddings, no "
      "biases. AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warmup then "
      "cosine decay to 10% of the peak LR, gradient clipping 1.0.")
    A("")
    for role in ("draft", "target"):
        t = r["train"][role]
        hp = t["hparams"]
        if hp.get("stop_at"):
            A(f"The {role}'s schedule (warmup + cosine planned for {hp['tokens']:,} tokens) is "
              f"deliberately stopped at step {hp['stop_at']}: run to the end it reached "
              "validation loss 4.41, better than the target manages in this CPU budget, and a "
              "draft stronger than its target makes a poor demonstration pair.")
            A("")
        A(f"{role} (peak LR {hp['lr']}, batch {hp['batch']} x {SEQ_LEN}) validation loss by "
          "tokens seen: " + ", ".join(
            f"{h['tokens'] / 1e6:.2f}M: {h['val_loss']:.3f}" for h in t["history"]))
        A("")
    tgt = r["train"]["target"]["history"]
    A("Neither model has converged; the ~25-minute CPU budget is the limit (the target's "
      f"validation loss fell by {tgt[-2]['val_loss'] - tgt[-1]['val_loss']:.3f} over its last "
      f"{(tgt[-1]['tokens'] - tgt[-2]['tokens']) / 1e6:.2f}M tokens). More tokens or a larger "
      "budget give a better pair from the same script.")
    A("")
    minutes = sum(r["train"][x]["train_seconds"] for x in ("draft", "target")) / 60
    A(f"Total training wall-clock: {minutes:.1f} min "
      "on a shared 2-core machine (other jobs were running, so time is not a throughput measure).")
    A("")
    A("## Files")
    A("")
    A("The HF folders hold float16 safetensors (backends upcast to fp32 at load when asked); "
      "GGUF F16 holds the same float16 values (norm vectors in F32), with llama.cpp's Q/K row "
      "permutation for rotary embeddings. Q8_0 was made from F16 with "
      "`llama_cpp.llama_model_quantize` with `pure=True`, so every matrix, including the tied "
      "embedding / LM head, is Q8_0 (all matrix dimensions are multiples of 32). "
      "`manifest.json` lists the same SHA-256 values and is checked by `tests/test_assets.py`.")
    A("")
    A("| file | bytes | SHA-256 |")
    A("|---|---:|---|")
    total = 0
    for rel, f in manifest["files"].items():
        total += f["bytes"]
        A(f"| `{rel}` | {f['bytes']:,} | `{f['sha256']}` |")
    A(f"| total (weights + tokenizers) | {total:,} | |")
    A("")
    A("Q4_0 is not shipped (it would push the package past its ~30 MB budget). Make it when "
      "needed (a second or two):")
    A("")
    A("```python")
    A("import ctypes, llama_cpp, specmac.assets as a")
    A("p = llama_cpp.llama_model_quantize_default_params()")
    A("p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0; p.pure = True; p.nthread = 2")
    A("src, dst = a.gguf_file('target', 'f16'), '/tmp/target-q4_0.gguf'")
    A("assert llama_cpp.llama_model_quantize(str(src).encode(), dst.encode(), ctypes.byref(p)) == 0")
    A("```")
    A("")
    A("## Cross-format agreement")
    A("")
    n_ok = sum(x["equal"] for x in r["tokenizer_check"])
    A(f"Tokenization: llama.cpp (`Llama(..., vocab_only=True).tokenize(b, add_bos=False, "
      f"special=True)`) gives the same ids as the HF tokenizer on {n_ok}/{len(r['tokenizer_check'])} "
      f"texts ({len(SNIPPETS)} snippets with tabs, CRLF, non-ASCII and an embedded "
      "`<|endoftext|>`, plus the first 3000 characters of 5 validation files); mlx-lm's tokenizer "
      "gives the same ids on the logit prompt.")
    A("")
    A("First-step logits (the next-token logits after the prompt `def fibonacci(n):\\n`), each "
      "compared with torch fp32 (HF folder loaded with `dtype=torch.float32`), max over the "
      "whole vocabulary:")
    A("")
    A("| role | logit range (torch) | llama.cpp F16 max abs diff | llama.cpp Q8_0 max abs diff | "
      "mlx fp32 max abs diff | argmax torch / F16 / Q8_0 / mlx |")
    A("|---|---|---|---|---|---|")
    for role in ("draft", "target"):
        c = r["logits"][role]
        A(f"| {role} | {c['logit_range'][0]:.2f} .. {c['logit_range'][1]:.2f} | "
          f"{c['llama_f16']['max_abs_diff']:.2e} | {c['llama_q8_0']['max_abs_diff']:.2e} | "
          f"{c['mlx_fp32']['max_abs_diff']:.2e} | {c['torch_fp32_argmax']} / "
          f"{c['llama_f16']['argmax']} / {c['llama_q8_0']['argmax']} / {c['mlx_fp32']['argmax']} |")
    A("")
    A(f"Greedy decoding of 32 tokens from the same prompt: llama.cpp F16 matches torch fp32 on "
      f"{r['llama_greedy_match_32']}/32 tokens (llama.cpp's CPU F16 matmul rounds activations to "
      "F16, so late argmax flips between near-tied tokens are possible).")
    A("")
    A("## Greedy sample (target, torch fp32, 96 tokens)")
    A("")
    A("```python")
    A(r["sample"])
    A("```")
    A("")
    A("Draft, 48 tokens:")
    A("")
    A("```python")
    A(r["draft_sample"])
    A("```")
    A("")
    A("## Draft/target acceptance")
    A("")
    A("Measured at K=4 by `scripts/train_embedded.py` with a plain, self-contained numpy "
      "implementation of speculative sampling, both models in torch fp32 (no KV cache), "
      "no top-k/top-p; T=0 accepts a drafted token while it equals the target's argmax, "
      "T=1 accepts with probability min(1, p/q) and resamples from max(0, p-q) on rejection. "
      f"{len(ACCEPT_PROMPTS)} prompts ({', '.join(repr(p) for p in ACCEPT_PROMPTS)}) x at "
      f"least 64 new tokens each (no stop at EOS), rng seed {SEED}. "
      "Acceptance = accepted / drafted.")
    A("")
    A("| T | drafted | accepted | acceptance | tokens per target pass |")
    A("|---|---:|---:|---:|---:|")
    for a in r["acceptance"]:
        A(f"| {a['temperature']:g} | {a['drafted']} | {a['accepted']} | {a['acceptance']:.3f} | "
          f"{a['tokens_per_target_pass']:.2f} |")
    A("")
    ca = r.get("core_acceptance")
    if isinstance(ca, list):
        A("The same prompts through specmac's own loop (`specmac.Pair.load('torch', 'torch', ...)`,"
          " fp32 on CPU, `max_tokens=64`, `k=4`, seeds "
          f"{SEED}..{SEED + len(ACCEPT_PROMPTS) - 1}, stops at EOS): " + "; ".join(
              f"T={a['temperature']:g}: {a['accepted']}/{a['drafted']} = {a['acceptance']:.3f}"
              for a in ca) + ".")
    else:
        A(f"(specmac's own loop could not be used when this was built: {ca['error']})")
    A("")
    tf = r["teacher_forced"]
    A(f"Lower-variance per-position view on {tf['positions']:,} validation-text positions "
      f"(teacher forcing): expected acceptance at T=1, E[sum_x min(p(x), q(x))] = "
      f"{tf['alpha_T1']:.3f}; at T=0, P(argmax q = argmax p) = {tf['alpha_T0']:.3f}.")
    A("")
    A("## Python API")
    A("")
    A("```python")
    A("from specmac import assets")
    A("assets.ROLES        # ('draft', 'target')")
    A("assets.GGUF_TYPES   # " + repr(tuple(manifest["gguf_types"])))
    A("assets.hf_dir('target')              # folder for transformers / mlx_lm.load")
    A("assets.gguf_file('draft', 'f16')     # GGUF path (default quant 'q8_0')")
    A("```")
    (ASSETS / "README.md").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work-dir", type=Path, default=REPO / "build" / "embedded",
                    help="where fp32 checkpoints and the tokenizer are kept (not shipped)")
    ap.add_argument("--skip-train", action="store_true",
                    help="reuse the tokenizer and fp32 checkpoints in --work-dir")
    ap.add_argument("--threads", type=int, default=N_THREADS)
    ap.add_argument("--roles", default="draft,target",
                    help="comma-separated roles to train; the others are reused from --work-dir")
    ap.add_argument("--stop-at", default="",
                    help="role=STEP[,role=STEP]: stop that role's (unchanged) schedule early, "
                         "at an evaluation step")
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

    stop_at = {k: int(v) for k, v in (x.split("=") for x in args.stop_at.split(",") if x)}
    roles = [] if args.skip_train else [r for r in args.roles.split(",") if r]
    infos = {}
    for role in ("draft", "target"):
        if role in roles:
            infos[role] = train_model(role, train, val_eval, work, stop_at.get(role))
        else:
            infos[role] = json.loads((work / role / "train_info.json").read_text())
    export_all(tok, infos, corpus, work, args.threads)


if __name__ == "__main__":
    main()
