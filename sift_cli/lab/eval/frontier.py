"""`sift eval frontier`: computed cell density against fidelity for each selection rule over a range of its
parameters, on several prompt sets, beside each prompt's numeric noise floor.

Per prompt set: the documents are run once per rule to get every point's bits (`thresholds.collect_stats` for the
paper rule's (T, α, β, γ), `mass_grid.collect_mass_bits` for the mass rule's (ε, ε')); full recompute once per
prompt (the reference), and once in the reference precision (`prefill.noise`: the noise floor); then SIFT at every
point. A point reports its mean computed cell density, the median and 90th-percentile KL(full ‖ SIFT) at the last
prompt position, the median of KL over the prompt's noise floor, and how many prompts keep the first token and the
greedy answer. No time is reported: this measures fidelity (`sift bench prefill` measures speed).

`compare_rules` states the issue's questions as data (docs/evaluation.md "The frontier"): on step frontiers (the
best median KL a rule reaches at or below a density), the mass rule's KL at the paper defaults' density against
the paper's, and the sparsest mass setting within 2× the noise floor against the density the paper rule needs to
reach the same KL (a paper rule that never reaches it in its range needs more than its densest point, so that
density gives a lower bound on the gap).
"""

from __future__ import annotations

import statistics

import numpy as np
import torch

from ...prefill.noise import kl_multiple, reference_run
from ...prefill.report import compare_logits
from ..runs import ModelSpec, ProgressBar, no_progress, run_metadata
from .backend import model_backend
from .frontier_sets import FRONTIER_SETS, frontier_set
from .mass_grid import MassPoint, MassSweepContext, parse_mass_points
from .sweep import GridPoint, SweepContext, check_points, parse_points

PAPER_DEFAULT = GridPoint(64, 1e-3, 1e-2, 0.1)
PAPER_POINTS = "64,0.0001,0.001,0.03;64,0.0003,0.003,0.05;64,0.001,0.01,0.1;64,0.003,0.03,0.2;64,0.01,0.1,0.3"
MASS_POINTS = "0.002,0.005;0.005,0.01;0.01,0.02;0.02,0.05;0.05,0.1;0.1,0.2;0.2,0.3"
NOISE_MULTIPLE_TARGET = 2.0  # "a setting within 2× the noise floor"
KL_RATIO_TARGET = 0.5  # the mass rule's KL at the paper defaults' density, over the paper's
DENSITY_GAP_TARGET = 0.10  # density the paper rule needs for the same KL, minus the mass rule's


def noise_floors(ctx: SweepContext, point, max_new_tokens: int) -> list[dict]:
    """Per prompt: full recompute in the reference precision against the served one (KL, same first token, same
    answer)."""
    out = []
    for spec, ref in zip(ctx.pset.prompts, ctx.dense):
        ids = torch.tensor([ctx.prompt(spec, point).input_ids], device=ctx.lm.device)
        logits, tokens, dtype = reference_run(ctx.lm, ids, max_new_tokens)
        cmp = compare_logits(ref["logits"], logits)
        out.append({"kl": cmp["kl"], "first_token_same": cmp["first_token_match"],
                    "same_answer": tokens == ref["tokens"], "reference_dtype": dtype})
    return out


def point_summary(row: dict, noise: list[dict]) -> dict:
    """A `SweepContext.evaluate` row with the frontier's statistics; per-prompt texts and times left out."""
    kls = [r["kl"] for r in row["prompts"]]
    multiples = [kl_multiple(k, n["kl"]) for k, n in zip(kls, noise)]
    finite = [m for m in multiples if m is not None]
    keep = ("tile_size", "rule", "alpha", "beta", "gamma", "epsilon", "ca_epsilon", "n", "density", "block_density",
            "la_bit_density", "ca_bit_density", "first_token_same_count", "same_answer_count")
    out = {k: row[k] for k in keep if k in row}
    out.setdefault("rule", "paper")
    out.update(kl_median=statistics.median(kls), kl_p90=float(np.percentile(kls, 90)), kl_mean=statistics.fmean(kls),
               kl_over_noise_median=statistics.median(finite) if finite else None,
               prompts_without_finite_multiple=len(multiples) - len(finite),
               kl_per_prompt=kls, cells_per_prompt=[r["cells"] for r in row["prompts"]])
    return out


def best_kl_at(points: list[dict], density: float) -> dict | None:
    """The point of lowest median KL among those computing at most `density` (a step frontier)."""
    under = [p for p in points if p["density"] <= density + 1e-9]
    return min(under, key=lambda p: p["kl_median"]) if under else None


def least_density_for(points: list[dict], kl: float) -> dict | None:
    """The sparsest point whose median KL is at most `kl`."""
    meeting = [p for p in points if p["kl_median"] <= kl]
    return min(meeting, key=lambda p: p["density"]) if meeting else None


def compare_rules(paper: list[dict], mass: list[dict], noise_median: float) -> dict:
    """The issue's targets on one prompt set (see the module): values, and whether each is met."""
    default = next((p for p in paper if (p["tile_size"], p["alpha"], p["beta"], p["gamma"])
                    == (PAPER_DEFAULT.tile, PAPER_DEFAULT.alpha, PAPER_DEFAULT.beta, PAPER_DEFAULT.gamma)), None)
    out: dict = {"noise_kl_median": noise_median}
    if default is not None:
        m = best_kl_at(mass, default["density"])
        ratio = m["kl_median"] / default["kl_median"] if m and default["kl_median"] > 0 else None
        out["at_paper_default"] = {"density": default["density"], "paper_kl_median": default["kl_median"],
                                   "mass_kl_median": m["kl_median"] if m else None,
                                   "mass_point": _params(m) if m else None, "kl_ratio": ratio,
                                   "met": ratio is not None and ratio <= KL_RATIO_TARGET}
    near = least_density_for(mass, NOISE_MULTIPLE_TARGET * noise_median)
    if near is None:
        out["within_noise"] = {"mass_point": None, "met": False}
    else:
        p = least_density_for(paper, near["kl_median"])
        # a paper rule that never reaches that KL in its range needs more than its densest point: a lower bound
        gap = (p["density"] if p else max(q["density"] for q in paper)) - near["density"]
        out["within_noise"] = {"mass_point": _params(near), "mass_density": near["density"],
                               "mass_kl_median": near["kl_median"],
                               "paper_density_for_same_kl": p["density"] if p else None,
                               "paper_reaches_that_kl": p is not None, "density_gap": gap,
                               "met": gap >= DENSITY_GAP_TARGET}
    out["mass_dominates"] = bool(out.get("at_paper_default", {}).get("met") and out["within_noise"]["met"])
    return out


def _params(p: dict) -> dict:
    keys = ("epsilon", "ca_epsilon") if p.get("rule") == "mass" else ("alpha", "beta", "gamma")
    return {"tile_size": p["tile_size"], **{k: p[k] for k in keys}}


def run_frontier(lm, pset, paper_points: list[GridPoint], mass_points: list[MassPoint], backend,
                 block_m: int | None = None, block_n: int = 64, max_new_tokens: int = 12, progress=None) -> dict:
    """Every point of both rules on one prompt set (see the module)."""
    ctx = SweepContext(lm, pset, paper_points, max_new_tokens)
    noise = noise_floors(ctx, paper_points[0], max_new_tokens)
    mass_ctx = MassSweepContext(ctx, mass_points)
    rules = {"paper": [], "mass": []}
    total, done = len(paper_points) + len(mass_points), 0
    for name, c, points in (("paper", ctx, paper_points), ("mass", mass_ctx, mass_points)):
        for pt in points:
            rules[name].append(point_summary(c.evaluate(pt, backend, block_m, block_n), noise))
            done += 1
            if progress:
                progress(done, total)
    noise_median = statistics.median(n["kl"] for n in noise)
    return {"prompt_set": pset.describe(), "tokens": [d["seq_len"] for d in ctx.dense],
            "noise_floor": {"reference_dtype": noise[0]["reference_dtype"], "kl_median": noise_median,
                            "kl_p90": float(np.percentile([n["kl"] for n in noise], 90)),
                            "first_token_same_count": sum(n["first_token_same"] for n in noise),
                            "same_answer_count": sum(n["same_answer"] for n in noise), "n": len(noise),
                            "kl_per_prompt": [n["kl"] for n in noise]},
            "rules": rules, "comparison": compare_rules(rules["paper"], rules["mass"], noise_median)}


def frontier_report(model: ModelSpec, sets=FRONTIER_SETS, n_prompts: int = 20, paper: str = PAPER_POINTS,
                    mass: str = MASS_POINTS, mass_tile: int = 64, seed: int = 0, backend: str = "auto",
                    block_m: int | None = None, block_n: int = 64, max_new_tokens: int = 12, data_dir=None,
                    essay_words: int = 1000, progress_bar: ProgressBar = no_progress) -> dict:
    """`sift eval frontier`: `run_frontier` on every set of `sets`. The points and the data are checked before
    the model loads."""
    paper_points, mass_points = parse_points(paper), parse_mass_points(mass, mass_tile)
    check_points(paper_points + [GridPoint(p.tile, 0.0, 0.0, 0.0) for p in mass_points])
    psets = [frontier_set(name, data_dir, n_prompts, seed, essay_words) for name in sets]
    lm = model.load()
    be = model_backend(backend, lm)
    results = []
    for name, pset in zip(sets, psets):
        with progress_bar(f"frontier {name}") as prog:
            results.append({"set": name, **run_frontier(lm, pset, paper_points, mass_points, be, block_m, block_n,
                                                        max_new_tokens, prog)})
    return {"sets": results, "backend": be.name, "block": [block_m, block_n], "max_new_tokens": max_new_tokens,
            "targets": {"kl_ratio_at_paper_default": KL_RATIO_TARGET, "noise_multiple": NOISE_MULTIPLE_TARGET,
                        "density_gap": DENSITY_GAP_TARGET},
            "mass_dominates_everywhere": all(r["comparison"]["mass_dominates"] for r in results),
            "run": run_metadata(lm)}
