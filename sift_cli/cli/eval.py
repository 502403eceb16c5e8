"""`sift eval …`: parse the flags, call one measurement of the lab (`sift_cli.lab.eval`), render its result as
tables (`eval_tables`) or one JSON object."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .console import out, print_json
from .eval_tables import render_frontier, render_qa, render_recall, render_storage, render_sweep
from .lab_args import ints, model_spec, progress_bars, threshold_points
from .options import (AlphaOpt, BackendOpt, BetaOpt, BlockMOpt, BlockNOpt, DataOpt, DeviceOpt, DtypeOpt, GammaOpt,
                      JsonOpt, ModelOpt, PlotOpt, SeedOpt, ThreadsOpt, TileOpt, TilesOpt, WorkOpt)
from .results import SaveOpt, check_outputs, finish

eval_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                       pretty_exceptions_enable=False,
                       help="Reproduce the paper's measurements on your model and corpus: recall, QA accuracy against "
                            "full recompute and CacheBlend, threshold sweeps, storage.")


# ---- eval recall -----------------------------------------------------------------------------------------------

@eval_app.command()
def recall(
    shards: Optional[Path] = typer.Option(None, "--shards", help="shard directory (with --prompts)"),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSONL: {\"doc_ids\": [...], \"question\": ...}"),
    data: Optional[str] = typer.Option(None, "--data", help="built-in prompt sets: nq or essays (profiled here)"),
    n_docs: int = typer.Option(20, "--n-docs", help="passages per NQ prompt"),
    n_prompts: int = typer.Option(6, "--n-prompts"),
    docs_per_prompt: int = typer.Option(3, "--docs-per-prompt", help="essays per prompt"),
    words: int = typer.Option(1600, "--words", help="essays: first N words"),
    seed: int = SeedOpt,
    tile: int = TileOpt, alpha: float = AlphaOpt, beta: float = BetaOpt, gamma: float = GammaOpt,
    block_m: int = BlockMOpt, block_n: int = BlockNOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    data_dir: Optional[Path] = DataOpt, work: Optional[Path] = WorkOpt, threads: int = ThreadsOpt,
    plot: Optional[Path] = PlotOpt, save: Optional[Path] = SaveOpt,
    as_json: bool = JsonOpt,
):
    """Recall of the truly high attention cells of composed prompts by the stored LA tiles and CA pages."""
    from ..lab.eval.recall import recall_report

    check_outputs(save, plot)
    res = recall_report(model_spec(model, device, dtype, threads), shards, prompts, data, data_dir, n_docs, n_prompts,
                        docs_per_prompt, words, seed, tile, alpha, beta, gamma, block_m, block_n, work,
                        progress_bar=progress_bars(as_json))
    finish(res, save, plot, "plot_recall", as_json, render_recall, kind="eval-recall")


# ---- eval qa ---------------------------------------------------------------------------------------------------

@eval_app.command("build-qa")
def build_qa(
    out_file: Path = typer.Option(..., "--out", "-o", help="records file to write (.jsonl or .jsonl.gz)"),
    n_docs: int = typer.Option(10, "--n-docs", help="passages per question (gold + distractors)"),
    questions: int = typer.Option(100, "--questions"),
    gold_position: str = typer.Option("random", "--gold-position", help="0-based slot of the gold passage, or random"),
    seed: int = SeedOpt,
    data_dir: Optional[Path] = DataOpt,
    as_json: bool = JsonOpt,
):
    """Write multi-document QA records from nq-open-oracle: gold passage + other questions' gold passages."""
    from ..lab.eval.qa_records import build_qa_file

    result = build_qa_file(out_file, n_docs, questions, gold_position, seed, data_dir)
    if as_json:
        print_json(result)
    else:
        out.print(f"wrote {result['records']} records ({n_docs} passages each, gold at {gold_position}) to "
                  f"{result['out']}")


@eval_app.command()
def qa(
    records: Optional[Path] = typer.Argument(None, help="QA records (JSON/JSONL, {question, answers, ctxs}); "
                                                        "omit with --nq"),
    nq: bool = typer.Option(False, "--nq", help="build the records from nq-open-oracle (see build-qa)"),
    n_docs: str = typer.Option("10", "--n-docs", help="documents per prompt, comma-separated to sweep (records "
                                                      "files: the first N contexts, gold kept)"),
    questions: int = typer.Option(50, "--questions", help="questions (sampled from a records file)"),
    gold_position: str = typer.Option("random", "--gold-position"),
    seed: int = SeedOpt,
    modes: str = typer.Option("full,sift,sink+window,kv-reuse,cacheblend", "--modes"),
    backend: str = BackendOpt,
    max_new_tokens: int = typer.Option(16, "--max-new-tokens"),
    ratio: float = typer.Option(0.15, "--recompute-ratio", help="CacheBlend: share of tokens recomputed"),
    blend_mask: str = typer.Option("causal", "--blend-mask", help="CacheBlend mask: causal (exact) or bottom-right "
                                                                  "(as its released code)"),
    tile: int = TileOpt, alpha: float = AlphaOpt, beta: float = BetaOpt, gamma: float = GammaOpt,
    block_m: int = BlockMOpt, block_n: int = BlockNOpt,
    rule: str = typer.Option("paper", "--rule", help="selection rule of SIFT's bits: paper (--alpha, --beta, "
                                                     "--gamma) or mass (--epsilon, --ca-epsilon)"),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="--rule mass: per-row dropped mass bound"),
    ca_epsilon: Optional[float] = typer.Option(None, "--ca-epsilon", help="--rule mass: CA dropped share bound"),
    noise_floor: bool = typer.Option(True, "--noise-floor/--no-noise-floor", help="also answer with full "
                                     "recompute in the reference precision (each mode's KL as a multiple of it)"),
    results: Optional[Path] = typer.Option(None, "--results", help="JSONL of per-question results: appended as "
                                                                  "they finish; a re-run resumes from it"),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    data_dir: Optional[Path] = DataOpt, work: Optional[Path] = WorkOpt, threads: int = ThreadsOpt,
    plot: Optional[Path] = PlotOpt, save: Optional[Path] = SaveOpt,
    as_json: bool = JsonOpt,
):
    """Answer multi-document questions with full recompute, SIFT, sink+window, KV reuse and CacheBlend."""
    from ..lab.eval.qa import qa_report

    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip())
    sizes = ints(n_docs, "--n-docs")
    selection = ({"rule": "mass", "epsilon": epsilon, "ca_epsilon": ca_epsilon} if rule == "mass"
                 else {"rule": rule, "epsilon": epsilon, "ca_epsilon": ca_epsilon, "alpha": alpha, "beta": beta,
                       "gamma": gamma})
    check_outputs(save, plot, results)
    result = qa_report(model_spec(model, device, dtype, threads), records, nq, sizes, questions, gold_position, seed,
                       mode_list, backend, max_new_tokens, ratio, blend_mask, tile, alpha, beta, gamma, block_m,
                       block_n, results, data_dir, work, progress_bar=progress_bars(as_json), noise_floor=noise_floor,
                       selection=selection)
    finish(result, save, plot, "plot_qa", as_json, lambda res: [render_qa(r) for r in res["runs"]],
           kind="eval-qa")


# ---- eval sweep ------------------------------------------------------------------------------------------------

@eval_app.command()
def sweep(
    data: Optional[str] = typer.Option(None, "--data", help="nq or essays"),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="or: sample prompts from this corpus"),
    n_docs: int = typer.Option(20, "--n-docs", help="passages per NQ prompt"),
    n_prompts: int = typer.Option(3, "--n-prompts"),
    docs_per_prompt: int = typer.Option(3, "--docs-per-prompt", help="essays / corpus documents per prompt"),
    words: int = typer.Option(1600, "--words"),
    seed: int = SeedOpt,
    points: Optional[str] = typer.Option(None, "--points", help="explicit grid 'T,α,β,γ;T,α,β,γ;…'"),
    tiles: str = TilesOpt,
    alphas: str = typer.Option("0.001,0.01", "--alphas"), betas: str = typer.Option("0.01", "--betas"),
    gammas: str = typer.Option("0.1", "--gammas"),
    block_m: int = typer.Option(64, "--block-m", help="64×64 masks as in STUDY.md by default"),
    block_n: int = BlockNOpt,
    with_recall: bool = typer.Option(False, "--recall", help="also measure recall at every point"),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens"),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    data_dir: Optional[Path] = DataOpt, threads: int = ThreadsOpt,
    plot: Optional[Path] = PlotOpt, save: Optional[Path] = SaveOpt,
    as_json: bool = JsonOpt,
):
    """Density, KL, first-token and answer agreement over a grid of (T, α, β, γ)."""
    from ..lab.eval.sweep import sweep_report

    pts = threshold_points(points, tiles, alphas, betas, gammas)
    check_outputs(save, plot)
    res = sweep_report(model_spec(model, device, dtype, threads), pts, data, corpus, data_dir, n_docs, n_prompts,
                       docs_per_prompt, words, seed, backend, block_m, block_n, max_new_tokens, with_recall,
                       progress_bar=progress_bars(as_json))
    finish(res, save, plot, "plot_sweep", as_json, render_sweep, kind="eval-sweep")


# ---- eval frontier -----------------------------------------------------------------------------------------------

@eval_app.command()
def frontier(
    sets: str = typer.Option("essays,nq10,nq20,pairs", "--sets", help="prompt sets: essays, nq10, nq20, pairs "
                                                                     "(two NQ questions, two gold passages)"),
    n_prompts: int = typer.Option(20, "--n-prompts", help="prompts per set"),
    paper: Optional[str] = typer.Option(None, "--paper-points", help="paper-rule points 'T,α,β,γ;…' (default: "
                                                                     "five around the paper's defaults)"),
    mass: Optional[str] = typer.Option(None, "--mass-points", help="mass-rule points 'ε,ε';…' (default: seven "
                                                                   "from 0.002 to 0.2)"),
    tile: int = typer.Option(64, "--tile", help="the mass rule's tile size"),
    essay_words: int = typer.Option(1000, "--essay-words", help="words kept of each essay"),
    seed: int = SeedOpt,
    block_m: Optional[int] = typer.Option(None, "--block-m", help="query block rows (default: the backend's)"),
    block_n: int = BlockNOpt,
    max_new_tokens: int = typer.Option(12, "--max-new-tokens", help="greedy tokens compared per prompt"),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, dtype: str = DtypeOpt,
    data_dir: Optional[Path] = DataOpt, threads: int = ThreadsOpt,
    plot: Optional[Path] = PlotOpt, save: Optional[Path] = typer.Option(None, "--save", help="write the result "
                                                                                             "JSON here"),
    as_json: bool = JsonOpt,
):
    """Computed density against KL, first token and answer for the paper and mass rules, beside the noise floor."""
    from ..lab.eval.frontier import MASS_POINTS, PAPER_POINTS, frontier_report

    names = [x.strip() for x in sets.split(",") if x.strip()]
    check_outputs(save, plot)
    res = frontier_report(model_spec(model, device, dtype, threads), names, n_prompts, paper or PAPER_POINTS,
                          mass or MASS_POINTS, tile, seed, backend, block_m, block_n, max_new_tokens, data_dir,
                          essay_words, progress_bar=progress_bars(as_json))
    finish(res, save, plot, "plot_frontier", as_json, render_frontier, kind="eval-frontier")


# ---- eval storage ----------------------------------------------------------------------------------------------

@eval_app.command()
def storage(
    shards: Optional[Path] = typer.Option(None, "--shards", help="also measure this shard directory"),
    tile: int = typer.Option(64, "--tile", help="tile size for the published-config rows"),
    models: Optional[str] = typer.Option(None, "--models", help="comma-separated subset of the built-in configs"),
    doc_lengths: str = typer.Option("128,512,1024,2048,4096,8192", "--doc-lengths"),
    plot: Optional[Path] = PlotOpt, save: Optional[Path] = SaveOpt,
    as_json: bool = JsonOpt,
):
    """SIFT metadata bytes against KV-cache bytes: a shard directory and published model configs."""
    from ..lab.eval.storage import storage_report

    chosen = [m.strip() for m in models.split(",") if m.strip()] if models else None
    res = storage_report(shards, tile, ints(doc_lengths, "--doc-lengths"), chosen)
    finish(res, save, plot, "plot_storage", as_json, lambda r: render_storage(r, tile), kind="eval-storage")
