"""advise over whole configurations: which draft and target, on which backend, in which precision,
at which K (K = 0: plain decoding), ranked by predicted tokens/s.

One engine answers "what will this configuration do here?" for a whole ranking
(``rank_configurations``: every variant of the given models on the installed backends) and for one
loaded pairing (``advise_pair``: the same measurements and predictions, restricted to it).

What is measured once and shared by every configuration that can share it:

* per target variant (a backend and a dtype or GGUF type of a target model): its pass T(n) for
  n = 1..k_max + 1 (``calibration.pass_costs``), the loop's own cost per step (a short plain run)
  and its logits on a reference text;
* per draft variant: its one-token pass T_d(1), its prefill of the prompts (a run pays it once,
  before its first draft, and a slow one outweighs what a short run gains) and
  its logits on the same text;
* acceptance per (draft variant, target variant) from those logits alone (teacher forcing on the
  reference text, which the first target variant wrote itself): greedy, whether the draft's argmax
  is the target's; sampled, sum_x min(p(x), q(x)), the chance that one draft survives the rejection
  rule. Acceptance depends on the two distributions, not on how fast a backend computes them, so no
  speculative run is needed.

Predictions walk the reference text as the loop does rather than use one acceptance rate: each
step drafts K tokens (an n-gram lookup: as many as it finds, at most K), keeps them while they are
accepted, position after position, and the next step starts where it ended, so runs of easy tokens
(acceptance is correlated along a text), short lookups and the end of a run are predicted as the
loop meets them (``Chains``).

Each target variant's configurations form a *precision group* with the other backends that run the
same weights in the same precision (one output distribution); speedups are against the fastest
plain decoder of that group, so a 3x speedup over a slow decoder is not mistaken for a fast one.
"""

import time
from collections.abc import Callable, Sequence

from specmac.advise.measure import Probe, lookup_rows, probe_draft, probe_target, warp_cost_ms
from specmac.advise.predict import acceptance_by_category, ranking
from specmac.advise.variants import Variant, model_backends, variants
from specmac.advise.workload import has_chat_template, reference
from specmac.backends import backend_class, load_backend
from specmac.core.sampling import SamplingParams
from specmac.errors import BadOption, SpecmacError
from specmac.tuning.timing import Progress, labelled
from specmac.vocab import check_compatible


def rank_configurations(draft_models: Sequence[str | None] = (None,),
                        target_models: Sequence[str | None] = (None,), *,
                        params: SamplingParams, prompts: Sequence[str | dict],
                        backends: Sequence[str] | None = None,
                        draft_backends: Sequence[str] | None = None, drafts: Sequence[str] | None = None,
                        hybrids: bool = True, chat: bool | None = False,
                        k_max: int = 8, run_tokens: int = 48,
                        seed: int = 0, target_options: dict | None = None, draft_options: dict | None = None,
                        notify: Callable[[str], None] | None = None,
                        progress: Progress | None = None) -> dict:
    """Probe every variant once, predict every configuration, rank. ``backends`` limits the
    backends tried (default: every installed model backend); ``drafts`` adds model-free drafters
    ("ngram" and "lookup", the default); ``hybrids``: each model draft also as the hybrid
    lookup+BACKEND; ``draft_backends`` are the drafts' backends (default ``backends``); ``*_options``
    go to every variant of that role (e.g. n_threads). ``prompts``: strings or workload prompts
    (with categories: every entry is also predicted per category); ``chat``: through the target's
    chat template (True), not (False), or where the target has one (None). ``notify`` hears of
    each variant as its probe starts, ``progress`` how far the probe is."""
    if not 1 <= k_max <= 16:
        raise BadOption(f"k_max {k_max} is out of range: use 1..16", param="k_max")
    if not prompts:
        raise BadOption("prompts is empty: give at least one prompt to measure acceptance on",
                        param="prompts")
    say = notify or (lambda _msg: None)
    names = model_backends(backends)
    t0 = time.perf_counter()
    # a backend whose plain decoding is fast writes the reference text
    tv = sorted(variants(target_models, "target", names),
                key=lambda v: not backend_class(v.backend).fast_plain)
    draft_names = model_backends(draft_backends) if draft_backends else names
    free = ("ngram", "lookup") if drafts is None else drafts
    dv = variants(draft_models, "draft", draft_names) + [Variant("draft", d, None, {}, "lookup", "prompt")
                                                         for d in free]
    for vs, extra in ((tv, target_options), (dv, draft_options)):
        for v in vs:
            if extra and not v.model_free:
                v.options = {**v.options, **extra}
    if not tv:
        raise BadOption("no installed backend can run the target models: install one "
                        "(pip install 'specmac[all]') or give other files", param="target_models")
    targets, skipped, ref, vocab = [], [], None, None
    for v in tv:
        say(f"target {v.label} ({v.source})")
        t1 = time.perf_counter()
        told = labelled(progress, f"target {v.label}: ")
        try:
            if told is not None:
                told("loading", 0, 0)
            backend = load_backend(v.backend, v.model, v.options, role="target")
            if chat and not has_chat_template(backend):
                raise SpecmacError(f"chat: target {v.label} ({v.source}) has no chat template: give the "
                                   "prompts without it, or a model that has one", param="chat")
            if ref is None:  # the first target that writes one gives the reference text
                ref = reference(backend, prompts, params, run_tokens, seed, chat, told)
                texts, starts, vocab = ref.texts, ref.starts, backend.vocab
            check_compatible(backend.vocab, vocab)
            targets.append(probe_target(v, backend, k_max, params, texts, starts, vocab.size, progress=told))
            targets[-1].seconds = time.perf_counter() - t1
        except SpecmacError as e:
            if e.param == "chat":  # asked of every target, not a reason to skip one
                raise
            skipped.append({**v.to_dict(), "role": "target", "reason": str(e)})
        finally:
            backend = None
            if told is not None:
                told("probed", 1, 1)
    if not targets:
        raise SpecmacError("no target variant could be probed: " + "; ".join(s["reason"] for s in skipped))
    groups = ref.groups()
    probed, alphas, by_cat = [], {}, {}
    # a hybrid drafts from LookupDrafter where it proposes and from its model elsewhere
    looked = (lookup_rows("lookup", texts, starts, params, vocab.size, k_max)
              if hybrids and any(not v.model_free for v in dv) else None)

    def add(p: Probe) -> None:
        for ti, t in enumerate(targets):
            key = len(probed), ti
            alphas[key], by_cat[key] = acceptance_by_category(p, t, params, k_max, groups)
        probed.append(p)

    for v in dv:
        say(f"draft {v.label} ({v.source})")
        t1 = time.perf_counter()
        told = labelled(progress, f"draft {v.label}: ")
        try:
            if told is not None and not v.model_free:
                told("loading", 0, 0)
            backend = None if v.model_free else load_backend(v.backend, v.model, v.options,
                                                                     role="draft")
            if backend is not None:
                check_compatible(backend.vocab, vocab)
            p = probe_draft(v, backend, params, texts, starts, vocab.size, k_max, told)
            p.seconds = time.perf_counter() - t1
        except SpecmacError as e:
            skipped.append({**v.to_dict(), "role": "draft", "reason": str(e)})
            continue
        finally:
            backend = None
            if told is not None:
                told("probed", 1, 1)
        add(p)
        if looked is not None and not v.model_free:
            hv = Variant("draft", f"lookup+{v.backend}", v.model, v.options, v.precision, v.source)
            add(Probe(hv, p.t_pass, 0.0, p.rows, t_prefill=p.t_prefill, prefills=p.prefills, t_feed=p.t_feed,
                      lookup=looked, seconds=p.seconds))
        p.rows = probed[-1].rows = []  # the acceptances are all this draft's logits were for
    for h in probed:  # the hybrid's lookup is LookupDrafter: what it is where its model does not pay
        if h.variant.hybrid:
            h.alone = next((p for p in probed if p.variant.backend == "lookup"), None)
    width = vocab.n_logits or vocab.size
    w1, wn = (warp_cost_ms(width, vocab.size, params, n) / 1e3 for n in (1, k_max + 1))
    w_row = max(wn - w1, 0.0) / k_max
    rows = ranking(targets, probed, alphas, k_max, w_row, 0.0 if params.greedy else w1, run_tokens,
                   by_cat, groups)
    return {
        "ranking": rows,
        "targets": [{**t.variant.to_dict(), "t_pass_ms": [1e3 * x for x in t.t_pass],
                     "loop_ms_per_step": 1e3 * t.t_step, "seconds": t.seconds} for t in targets],
        "drafts": [{**d.variant.to_dict(), "t_pass_ms": 1e3 * d.t_pass[0], "prefill_ms": 1e3 * d.t_prefill,
                    "seconds": d.seconds}
                   for d in probed],
        "acceptance": [{"draft": probed[di].variant.label, "draft_source": probed[di].variant.source,
                        "target": targets[ti].variant.label, "target_source": targets[ti].variant.source,
                        "alpha": a.alpha, "tokens_per_pass": a.tokens} for (di, ti), a in alphas.items()],
        "skipped": skipped,
        "reference": {**ref.info(), "written_by": targets[0].variant.label},
        "hybrid": "predicted from the measured acceptances, not run: per step the lookup's drafts where it "
                  "proposes, the model's elsewhere, the model fed what lookup steps wrote (a batched pass at "
                  "its prefill's rate per token) and its prefill of the prompt paid; where that is slower "
                  "than the lookup alone, it is the lookup alone (the hybrid starts its model only where it "
                  "pays)",
        "k_max": k_max, "sampling": params.to_dict(), "seconds": time.perf_counter() - t0,
    }
