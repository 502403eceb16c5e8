"""`sift calibrate`: the sparsest thresholds (T, α, β, γ) that meet a fidelity target on the user's own prompts.

Thresholds that suit Llama-3-8B do not suit every model (STUDY.md: on SmolLM2 agreement falls quickly as density
drops), so the choice is measured: prompts are sampled from the user's corpus, the documents are run once to
collect threshold-free statistics, every candidate's density is computed from its bits alone (decode, no
forward), and candidates are then evaluated from the sparsest upwards; the first that meets every target on
the sample is the sparsest that does, and the search stops there.

Targets (any combination; all must hold): mean KL(full ‖ SIFT) at the last prompt position ≤ `max_kl`;
the median over prompts of KL over the prompt's numeric noise floor (`prefill.noise`) ≤ `max_kl_over_noise`;
first-token agreement ≥ `min_agreement`; recall (the smaller of LA and CA recall) ≥ `min_recall`. Candidates are
one rule's: the paper rule's (T, α, β, γ) or the mass rule's (T, ε, ε'; `mass_grid`). Every report holds the
prompts' noise floor (one more untimed full recompute per prompt, in the reference precision).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from ...config_file import FILE_NAME, write_config
from ...corpus import CorpusFormat, load_documents
from ...errors import SiftError
from ...models import resolve_device
from ...output_dirs import check_writable_dir
from ..runs import ModelSpec, ProgressBar, no_progress, run_metadata
from .backend import eval_backend, model_backend
from .prompt_sets import PromptSet, check_document_count, corpus_prompt_set
from ...sample import resolve_corpus
from .frontier import noise_floors, point_summary
from .mass_grid import MassPoint, MassSweepContext
from .sweep import GridPoint, SweepContext, check_points


@dataclass(frozen=True)
class Target:
    max_kl: float | None = None
    min_agreement: float | None = None
    min_recall: float | None = None
    max_kl_over_noise: float | None = None

    def check(self) -> None:
        if all(v is None for v in (self.max_kl, self.min_agreement, self.min_recall, self.max_kl_over_noise)):
            raise SiftError("name a target: --max-kl, --max-kl-over-noise, --min-agreement and/or --min-recall")
        if self.max_kl_over_noise is not None and self.max_kl_over_noise < 0:
            raise SiftError("--max-kl-over-noise must be >= 0")
        for name in ("min_agreement", "min_recall"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 1:
                raise SiftError(f"--{name.replace('_', '-')} {v}: must be between 0 and 1")
        if self.max_kl is not None and self.max_kl < 0:
            raise SiftError("--max-kl must be >= 0")

    def describe(self) -> str:
        parts = []
        if self.max_kl is not None:
            parts.append(f"kl <= {self.max_kl:g}")
        if self.max_kl_over_noise is not None:
            parts.append(f"median kl <= {self.max_kl_over_noise:g}x the noise floor")
        if self.min_agreement is not None:
            parts.append(f"first-token agreement >= {self.min_agreement:g}")
        if self.min_recall is not None:
            parts.append(f"recall >= {self.min_recall:g}")
        return " and ".join(parts)

    def met(self, row: dict) -> bool:
        if self.max_kl is not None and row["kl_mean"] > self.max_kl:
            return False
        if self.max_kl_over_noise is not None and (row.get("kl_over_noise_median") is None
                                                   or row["kl_over_noise_median"] > self.max_kl_over_noise):
            return False
        if self.min_agreement is not None and row["first_token_agreement"] < self.min_agreement:
            return False
        if self.min_recall is not None and (row.get("recall") is None or row["recall"] < self.min_recall):
            return False
        return True


def check_candidates(points: list, target: Target) -> None:
    """One rule's candidates, valid, and a target that rule can be measured against (before any model work)."""
    target.check()
    if not points:
        raise SiftError("no candidates")
    if not isinstance(points[0], MassPoint):
        check_points(points)
        return
    if not all(isinstance(p, MassPoint) for p in points) or len({p.tile for p in points}) != 1:
        raise SiftError("mass-rule candidates share one --tiles value and no paper-rule --points")
    check_points([GridPoint(points[0].tile, 0.0, 0.0, 0.0)])
    if target.min_recall is not None:
        raise SiftError("--min-recall measures the paper rule's thresholds; with --rule mass use --max-kl-over-noise "
                        "or --max-kl")


def calibrate(lm, pset: PromptSet, points: list, target: Target, backend=None, block_m: int = 128,
              block_n: int = 64, max_new_tokens: int = 8, progress=None) -> dict:
    """points: GridPoints (the paper rule) or MassPoints (the mass rule), not both."""
    check_candidates(points, target)
    mass = isinstance(points[0], MassPoint)
    backend = backend or model_backend("auto", lm)
    anchor = GridPoint(points[0].tile, 1e-3, 1e-2, 0.1) if mass else points[0]
    ctx = SweepContext(lm, pset, [anchor] if mass else points, max_new_tokens)
    noise = noise_floors(ctx, anchor, max_new_tokens)
    if mass:
        ctx = MassSweepContext(ctx, points)
    candidates = []
    for p in points:
        d = ctx.densities(p, block_m, block_n)
        candidates.append({**p.as_dict(), "density": statistics.fmean(x["cells"] for x in d), "point": p})
    # sparsest first; among equal densities the more conservative parameters first
    order = (("epsilon", "ca_epsilon") if mass else ("alpha", "beta", "gamma"))
    candidates.sort(key=lambda c: (round(c["density"], 6), *(c[k] for k in order), -c["tile_size"]))
    evaluated, chosen = [], None
    for i, c in enumerate(candidates):
        row = ctx.evaluate(c["point"], backend, block_m, block_n, recall=target.min_recall is not None)
        summary = point_summary(row, noise)
        row.update(kl_median=summary["kl_median"], kl_over_noise_median=summary["kl_over_noise_median"])
        row["meets_target"] = target.met(row)
        evaluated.append(row)
        if progress:
            progress(i + 1, len(candidates))
        if row["meets_target"]:
            chosen = row
            break
    for c in candidates:
        c.pop("point")
    return {"target": target.describe(), "rule": "mass" if mass else "paper", "chosen": chosen,
            "evaluated": evaluated, "candidates": candidates, "prompt_set": pset.describe(), "backend": backend.name,
            "block": [block_m, block_n], "dense_tokens": [d["seq_len"] for d in ctx.dense],
            "noise_floor": {"reference_dtype": noise[0]["reference_dtype"],
                            "kl_median": statistics.median(n["kl"] for n in noise),
                            "first_token_agreement": sum(n["first_token_same"] for n in noise) / len(noise),
                            "same_answer": sum(n["same_answer"] for n in noise) / len(noise),
                            "kl_per_prompt": [n["kl"] for n in noise]},
            "advice": None if chosen is not None else advice(target, evaluated)}


def advice(target: Target, evaluated: list[dict]) -> str:
    """What to do when no candidate met the target, from what was measured: the best each failed measure reached,
    and whether denser candidates could help (the densest measured computed nearly every cell: then only a
    looser target can)."""
    if not evaluated:
        return "no candidate was evaluated — give candidates with --points or --tiles/--alphas/--betas/--gammas"
    densest = max(evaluated, key=lambda r: r["density"])
    reached = []
    if target.max_kl is not None:
        best = min(evaluated, key=lambda r: r["kl_mean"])
        reached.append(f"KL {best['kl_mean']:.2g} at best (target <= {target.max_kl:g}; --max-kl "
                       f"{best['kl_mean'] * 1.05:.2g} would pass)")
    if target.max_kl_over_noise is not None:
        finite = [r["kl_over_noise_median"] for r in evaluated if r.get("kl_over_noise_median") is not None]
        if finite:
            reached.append(f"KL {min(finite):.2g}× the noise floor at best (target <= "
                           f"{target.max_kl_over_noise:g}×)")
    if target.min_agreement is not None:
        best = max(evaluated, key=lambda r: r["first_token_agreement"])
        reached.append(f"first-token agreement {best['first_token_agreement']:.0%} at best (target >= "
                       f"{target.min_agreement:.0%})")
    if target.min_recall is not None:
        recalls = [r.get("recall") for r in evaluated if r.get("recall") is not None]
        if recalls:
            reached.append(f"recall {max(recalls):.2%} at best (target >= {target.min_recall:.2%})")
    if densest["density"] >= 0.98:
        reached.append(f"the densest candidate already computes {densest['density']:.0%} of the attention cells, "
                       "so denser ones cannot do much better on this model — loosen the target")
    elif "epsilon" in densest:
        reached.append(f"the densest candidate computes {densest['density']:.0%} of the cells — loosen the target, "
                       f"or add denser candidates (smaller --epsilons or --ca-epsilons than "
                       f"{min(r['epsilon'] for r in evaluated):g}, {min(r['ca_epsilon'] for r in evaluated):g})")
    else:
        reached.append(f"the densest candidate computes {densest['density']:.0%} of the cells — loosen the target, "
                       f"or add denser candidates (smaller --alphas, --betas or --gammas than "
                       f"{min(r['alpha'] for r in evaluated):g}, {min(r['beta'] for r in evaluated):g}, "
                       f"{min(r['gamma'] for r in evaluated):g}, or a smaller --tiles)")
    return "; ".join(reached)


def read_queries(path: Path | None) -> list[str] | None:
    """`--queries`: typical user questions, one per line (None: generic ones)."""
    if path is None:
        return None
    if path.is_dir():
        raise SiftError(f"--queries {path} is a folder — give a file of questions, one per line")
    if not path.is_file():
        raise SiftError(f"--queries {path}: file not found")
    qs = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not qs:
        raise SiftError(f"--queries {path}: no questions")
    return qs


def check_calibrate_inputs(model: ModelSpec, corpus: str, points: list[GridPoint], target: Target,
                           fmt: CorpusFormat, docs_per_prompt: int, queries: Path | None, backend: str, block_m: int,
                           block_n: int, max_new_tokens: int, config_out: Path, dry_run: bool
                           ) -> tuple[list, list[str] | None]:
    """Every check of `sift calibrate` that needs no model, before it loads: the target, the candidates, the
    questions, the corpus, the backend on the device, the block sizes, and where the choice is written. Returns the
    corpus's documents and the questions."""
    check_candidates(points, target)
    if block_m < 1 or block_n < 1:
        raise SiftError(f"--block-m {block_m} / --block-n {block_n}: block sizes must be positive")
    if max_new_tokens < 0:
        raise SiftError(f"--max-new-tokens {max_new_tokens}: must be at least 0")
    eval_backend(backend, resolve_device(model.device))
    if not dry_run:
        if Path(config_out).is_dir():
            raise SiftError(f"--config-out {config_out} is a folder — give the file to write (sift.toml)")
        check_writable_dir(Path(config_out).parent, "--config-out's folder")
    qs = read_queries(queries)
    docs = load_documents(resolve_corpus(corpus), fmt)
    check_document_count(docs, docs_per_prompt, str(corpus))
    return docs, qs


def calibrate_corpus(model: ModelSpec, corpus: str, points: list[GridPoint], target: Target,
                     fmt: CorpusFormat = CorpusFormat(), n_prompts: int = 4, docs_per_prompt: int = 5,
                     queries: Path | None = None, seed: int = 0, backend: str = "auto", block_m: int = 128,
                     block_n: int = 64, max_new_tokens: int = 8, config_out: Path = Path(FILE_NAME),
                     dry_run: bool = False, progress_bar: ProgressBar = no_progress) -> dict:
    """`sift calibrate`: the sparsest point meeting `target` on prompts sampled from `corpus`, written to
    `config_out` (sift.toml, which `sift profile` reads) unless `dry_run`; res["config"] is the file written."""
    docs, qs = check_calibrate_inputs(model, corpus, points, target, fmt, docs_per_prompt, queries, backend,
                                      block_m, block_n, max_new_tokens, config_out, dry_run)
    lm = model.load()
    pset = corpus_prompt_set(docs, fmt, n_prompts, docs_per_prompt, qs, seed, lm=lm,  # prompts fit the context
                             source=str(corpus))
    be = model_backend(backend, lm)
    with progress_bar("calibrating") as prog:
        res = calibrate(lm, pset, points, target, be, block_m, block_n, max_new_tokens, progress=prog)
    res["run"] = run_metadata(lm)
    chosen = res["chosen"]
    if chosen is not None and not dry_run:
        prof = ({"tile": chosen["tile_size"], "rule": "mass", "epsilon": chosen["epsilon"],
                 "ca_epsilon": chosen["ca_epsilon"]} if res["rule"] == "mass" else
                {"tile": chosen["tile_size"], "alpha": chosen["alpha"], "beta": chosen["beta"],
                 "gamma": chosen["gamma"]})
        cal = {"model": lm.name, "weights": lm.fingerprint, "config_hash": lm.config_hash, "corpus": str(corpus),
               "target": res["target"], "prompts": len(pset.prompts), "docs_per_prompt": docs_per_prompt,
               "density": round(chosen["density"], 4), "kl_mean": chosen["kl_mean"],
               "kl_over_noise_median": chosen["kl_over_noise_median"],
               "noise_kl_median": res["noise_floor"]["kl_median"],
               "first_token_agreement": chosen["first_token_agreement"], "recall": chosen.get("recall"),
               "block": f"{block_m}x{block_n}", "date": res["run"]["date"]}
        res["config"] = str(write_config(config_out, prof, cal, "written by `sift calibrate`; read by `sift profile` "
                                                                 "as its default thresholds (flags still win)"))
    return res
