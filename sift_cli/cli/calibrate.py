"""`sift calibrate`: the sparsest setting of a selection rule that meets a fidelity target on prompts from the user's
corpus (`sift_cli.lab.eval.calibrate`), written as sift.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import SiftError
from .eval_tables import render_calibrate
from .lab_args import floats, ints, model_spec, progress_bars, threshold_points
from .options import (BackendOpt, BlockMOpt, BlockNOpt, DeviceOpt, DtypeOpt, IdFieldOpt, JsonOpt, ModelOpt, SeedOpt,
                      TemplateOpt, TextFieldOpt, ThreadsOpt, TilesOpt, TitleFieldOpt)
from .results import SaveOpt, finish

NO_CANDIDATE = 4  # the exit code when no candidate meets the target (docs/cli.md)


def calibrate(
    corpus: str = typer.Argument(..., help="the corpus you will profile (same formats as `sift profile`)"),
    max_kl: Optional[float] = typer.Option(None, "--max-kl", help="target: mean KL(full ‖ SIFT) at the last "
                                                                  "position <= this"),
    min_agreement: Optional[float] = typer.Option(None, "--min-agreement", help="target: first-token agreement "
                                                                                ">= this (0..1)"),
    min_recall: Optional[float] = typer.Option(None, "--min-recall", help="target: min(LA, CA) recall >= this"),
    max_kl_over_noise: Optional[float] = typer.Option(None, "--max-kl-over-noise", help="target: the median over "
                                                      "prompts of KL(full ‖ SIFT) over the prompt's numeric noise "
                                                      "floor <= this (docs/evaluation.md)"),
    rule: str = typer.Option("paper", "--rule", help="candidates of the paper rule (--points or --tiles/--alphas/"
                                                     "--betas/--gammas) or the mass rule (--epsilons, "
                                                     "--ca-epsilons, one --tiles)"),
    epsilons: str = typer.Option("0.005,0.01,0.02,0.05,0.1", "--epsilons", help="--rule mass: ε candidates"),
    ca_epsilons: str = typer.Option("0.02,0.05,0.1", "--ca-epsilons", help="--rule mass: ε' candidates"),
    n_prompts: int = typer.Option(4, "--n-prompts", help="prompts sampled from the corpus"),
    docs_per_prompt: int = typer.Option(5, "--docs-per-prompt"),
    queries: Optional[Path] = typer.Option(None, "--queries", help="file of typical user questions, one per line"),
    seed: int = SeedOpt,
    points: Optional[str] = typer.Option(None, "--points", help="explicit candidates 'T,α,β,γ;…'"),
    tiles: str = TilesOpt,
    alphas: str = typer.Option("0.001,0.003,0.01,0.03", "--alphas"), betas: str = typer.Option("0.01,0.03", "--betas"),
    gammas: str = typer.Option("0.1,0.3", "--gammas"),
    block_m: int = BlockMOpt,
    block_n: int = BlockNOpt,
    max_new_tokens: int = typer.Option(8, "--max-new-tokens", help="greedy tokens compared per prompt (reported)"),
    config_out: Path = typer.Option(Path("sift.toml"), "--config-out", help="where to write the choice (`sift "
                                                                            "profile` reads ./sift.toml)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="measure and report, write nothing"),
    id_field: str = IdFieldOpt,
    text_field: str = TextFieldOpt,
    title_field: str = TitleFieldOpt,
    template: Optional[str] = TemplateOpt,
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt, threads: int = ThreadsOpt,
    save: Optional[Path] = SaveOpt, as_json: bool = JsonOpt,
):
    """Pick the sparsest (T, α, β, γ) that meets your fidelity target on prompts from your corpus; write sift.toml."""
    from ..corpus import corpus_format
    from ..lab.eval.calibrate import Target, calibrate_corpus

    if rule not in ("paper", "mass"):
        raise SiftError(f"--rule {rule}: expected paper or mass")
    if rule == "mass":
        from ..lab.eval.mass_grid import MassPoint

        pts = [MassPoint(t, e, c) for t in ints(tiles, "--tiles") for e in floats(epsilons, "--epsilons")
               for c in floats(ca_epsilons, "--ca-epsilons")]
    else:
        pts = threshold_points(points, tiles, alphas, betas, gammas)
    target = Target(max_kl, min_agreement, min_recall, max_kl_over_noise)
    res = calibrate_corpus(model_spec(model, device, dtype, threads), corpus, pts, target,
                           corpus_format(id_field, text_field, title_field, template), n_prompts, docs_per_prompt,
                           queries, seed, backend, block_m, block_n, max_new_tokens, config_out, dry_run,
                           progress_bar=progress_bars(as_json))
    finish(res, save, None, None, as_json, render_calibrate, kind="calibrate")
    if res["chosen"] is None:
        raise typer.Exit(NO_CANDIDATE)
