"""The tables `sift eval …` and `sift calibrate` print from a lab result (the same result --json prints whole)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from .console import err, fmt, human_bytes, out, pct


def render_recall(res: dict) -> None:
    o, p = res["overall"], res["paper"]
    th = res["thresholds"]
    out.print(f"[bold]recall[/] over {len(res['prompts'])} prompts (T={th['tile_size']}, α={th['alpha']}, "
              f"β={th['beta']}; blocks {res['block'][0]}×{res['block'][1]})")
    a = res["area"]
    out.print(f"  attention area: always dense {pct(a['dense'])}, LA {pct(a['la'])}, CA {pct(a['ca'])}")
    t = Table(show_edge=False)
    for col in ("", "recall", "block recall", "chosen density", "true density", "chosen tiles/pages",
                "true tiles/pages", "paper recall", "paper chosen / true sparsity"):
        t.add_column(col, justify="right")
    t.add_row("LA", pct(o["la_recall"]), pct(o["la_block_recall"]), pct(o["la_chosen_density"]),
              pct(o["la_true_density"]), pct(o["la_chosen_tile_density"]), pct(o["la_true_tile_density"]),
              pct(p["la_recall"]), f"{pct(p['la_chosen_sparsity'])} / {pct(p['la_true_sparsity'])}")
    t.add_row("CA", pct(o["ca_recall"]), pct(o["ca_block_recall"]), pct(o["ca_chosen_density"]),
              pct(o["ca_true_density"]), pct(o["ca_chosen_page_density"]), pct(o["ca_true_page_density"]),
              pct(p["ca_recall"]), f"{pct(p['ca_chosen_sparsity'])} / {pct(p['ca_true_sparsity'])}")
    out.print(t)
    out.print(f"  attention mass of document rows kept by the computed blocks: {pct(o['attention_mass_kept'])}")
    t = Table(title="per layer", show_edge=False)
    for col in ("layer", "LA recall", "CA recall", "LA tiles chosen (heads q1..q3)", "LA tiles true", "CA pages chosen"):
        t.add_column(col, justify="right")
    for r in res["per_layer"]:
        h = r["la_tile_density_heads"]
        t.add_row(str(r["layer"]), pct(r["la_recall"]), pct(r["ca_recall"]),
                  f"{pct(r['la_chosen_tile_density'])} ({pct(h['q1'])}..{pct(h['q3'])})",
                  pct(r["la_true_tile_density"]), pct(r["ca_chosen_page_density"]))
    out.print(t)


def render_qa(r: dict) -> None:
    out.print(f"[bold]{r['n_docs']} documents[/], {r['questions']} questions, {r['mean_tokens']:.0f} tokens on "
              f"average (backend {r['backend']}, CacheBlend ratio {r['cacheblend']['ratio']}, mask "
              f"{r['cacheblend']['mask']})")
    t = Table(show_edge=False)
    t.add_column("mode", no_wrap=True)
    for col in ("n", "accuracy", "same answer as full", "same first token", "KL mean", "KL median", "× noise",
                "density"):
        t.add_column(col, justify="right")
    for mode, s in r["summary"].items():
        name = f"full in {s['reference_dtype']} (noise floor)" if mode == "noise_floor" else mode
        m = s.get("kl_over_noise_median")
        t.add_row(name, str(s["n"]), pct(s["accuracy"]), pct(s["agreement_with_full"]),
                  pct(s["first_token_agreement"]), fmt(s["kl_mean"]), fmt(s["kl_median"]),
                  "-" if m is None else f"{m:.2g}×",
                  pct(s.get("cell_density_mean")) if "cell_density_mean" in s else "-")
    out.print(t)
    out.print("  [dim]no time to first token here: each question is a new prompt shape, run once per mode; "
              "`sift bench prefill` times modes warm, per shape[/]")


def render_sweep(res: dict) -> None:
    ps = res["prompt_set"]
    out.print(f"[bold]sweep[/] on {ps['name']} ({ps['prompts']} prompts, {ps['documents']} documents; "
              f"{res['dense'][0]['tokens'] if res['dense'] else '-'} tokens in the first), blocks "
              f"{res['block'][0]}×{res['block'][1]}, backend {res['backend']}")
    t = Table(show_edge=False)
    cols = ["T", "α", "β", "γ", "density", "block density", "LA bits", "CA bits", "KL mean", "KL max",
            "same first token", f"same {res['max_new_tokens']}-token answer"]
    has_recall = any("la_recall" in p for p in res["points"])
    if has_recall:
        cols += ["LA recall", "CA recall"]
    for c in cols:
        t.add_column(c, justify="right")
    for p in res["points"]:
        row = [str(p["tile_size"]), f"{p['alpha']:g}", f"{p['beta']:g}", f"{p['gamma']:g}", f"{p['density']:.3f}",
               f"{p['block_density']:.3f}", pct(p["la_bit_density"]), pct(p["ca_bit_density"]), fmt(p["kl_mean"], 2),
               fmt(p["kl_max"], 2), f"{p['first_token_same_count']}/{p['n']}", f"{p['same_answer_count']}/{p['n']}"]
        if has_recall:
            row += [pct(p.get("la_recall")), pct(p.get("ca_recall"))]
        t.add_row(*row)
    out.print(t)


def render_storage(res: dict, tile: int) -> None:
    if "shards" in res:
        s = res["shards"]
        out.print(f"[bold]{s['path']}[/]: {s['documents']} documents, {s['tokens']:,} tokens (mean "
                  f"{s['tokens_mean']:.0f}), T={s['tile_size']}, model {s['model']}")
        out.print(f"  bit vectors {human_bytes(s['metadata_bytes'])} ({human_bytes(s['shard_bytes_on_disk'])} on disk "
                  f"with tokens) vs KV cache {human_bytes(s['kv_cache_bytes_bf16'])} (bf16): "
                  f"{s['kv_to_metadata_ratio'] or 0:,.0f}× smaller ({s['kv_to_disk_ratio'] or 0:,.0f}× on disk)")
    t = Table(title=f"per document, T={tile} (byte-padded as stored; the paper's unpadded bits in brackets)",
              show_edge=False)
    t.add_column("model", no_wrap=True)
    for c in ("L×H (KV)", "doc tokens", "SIFT", "KV cache", "KV / SIFT", "equal at"):
        t.add_column(c, justify="right")
    for r in res["models"]:
        t.add_row(r["model"], f"{r['layers']}×{r['heads']} ({r['kv_heads']})", f"{r['doc_tokens']:,}",
                  human_bytes(r["sift_bytes"]), human_bytes(r["kv_bytes"]),
                  f"{r['kv_over_sift']:,.0f}× ({r['kv_over_sift_unpadded']:,.0f}×)",
                  f"{r['crossover_doc_tokens'] / 1e6:.1f}M tok")
    out.print(t)
    t = Table(title="per prompt of 1K-token documents at T=32 (the paper's Fig. 15 setting)", show_edge=False)
    t.add_column("model", no_wrap=True)
    for c in ("prompt tokens", "SIFT", "KV cache", "KV per layer", "KV / SIFT"):
        t.add_column(c, justify="right")
    for r in res["prompts"]:
        t.add_row(r["model"], f"{r['prompt_tokens']:,}", human_bytes(r["sift_bytes"]), human_bytes(r["kv_bytes"]),
                  human_bytes(r["kv_bytes_per_layer"]), f"{r['kv_over_sift']:,.0f}×")
    out.print(t)
    out.print("paper: Llama-3-8B ~24,000× at typical document lengths, equal at 33.6M tokens; 1.0 / 2.5 / 4.5 MB "
              "per prompt at 15K / 32K / 64K")


def _rule_params(p: dict) -> str:
    if p.get("rule") == "mass":
        return f"mass ε={p['epsilon']:g} ε'={p['ca_epsilon']:g}"
    return f"α={p['alpha']:g} β={p['beta']:g} γ={p['gamma']:g}"


def render_calibrate(res: dict) -> None:
    out.print(f"[bold]calibrate[/]: target {res['target']}; {res['prompt_set']['prompts']} prompts of "
              f"{res['prompt_set']['docs_per_prompt']} documents ({res['dense_tokens']} tokens); "
              f"{len(res['candidates'])} candidates, {len(res['evaluated'])} evaluated (sparsest first)")
    nf = res["noise_floor"]
    out.print(f"noise floor (full recompute {nf['reference_dtype']} vs served): median KL {fmt(nf['kl_median'], 2)}, "
              f"first token {pct(nf['first_token_agreement'])}, answer {pct(nf['same_answer'])}")
    t = Table(show_edge=False)
    for c in ("T", "parameters", "density", "KL mean", "KL median", "× noise", "first token", "recall",
              "meets target"):
        t.add_column(c, justify="right")
    for p in res["evaluated"]:
        m = p.get("kl_over_noise_median")
        t.add_row(str(p["tile_size"]), _rule_params(p), f"{p['density']:.3f}", fmt(p["kl_mean"], 2),
                  fmt(p["kl_median"], 2), "-" if m is None else f"{m:.2g}×", pct(p["first_token_agreement"]),
                  pct(p.get("recall")), "[green]yes[/]" if p["meets_target"] else "no")
    out.print(t)
    c = res["chosen"]
    if c is None:
        err.print(f"[red]no candidate meets the target[/] ({escape(res['target'])}); nothing written: "
                  f"{escape(res['advice'])}")
        return
    out.print(f"chosen: T={c['tile_size']} {_rule_params(c)} — computes {pct(c['density'])} of causal attention "
              f"cells")
    if res.get("config"):
        out.print(f"wrote {res['config']}: `sift profile` uses these thresholds by default")


def render_frontier(res: dict) -> None:
    for r in res["sets"]:
        ps, nf, c = r["prompt_set"], r["noise_floor"], r["comparison"]
        out.print(f"[bold]{escape(r['set'])}[/]: {ps['prompts']} prompts, {min(r['tokens'])}..{max(r['tokens'])} "
                  f"tokens ({escape(ps['source'])}); noise floor (full {nf['reference_dtype']} vs served): median "
                  f"KL {fmt(nf['kl_median'], 2)}, first token {nf['first_token_same_count']}/{nf['n']}, answer "
                  f"{nf['same_answer_count']}/{nf['n']}")
        t = Table(show_edge=False)
        for col in ("rule", "parameters", "cells computed", "KL median", "KL p90", "× noise", "same first token",
                    "same answer"):
            t.add_column(col, justify="right" if col not in ("rule", "parameters") else "left")
        for rule, points in r["rules"].items():
            for p in sorted(points, key=lambda p: p["density"]):
                params = (f"ε={p['epsilon']:g} ε'={p['ca_epsilon']:g}" if rule == "mass"
                          else f"α={p['alpha']:g} β={p['beta']:g} γ={p['gamma']:g}")
                m = p["kl_over_noise_median"]
                t.add_row(rule, f"T={p['tile_size']} {params}", pct(p["density"]), fmt(p["kl_median"], 2),
                          fmt(p["kl_p90"], 2), "-" if m is None else f"{m:.2g}×",
                          f"{p['first_token_same_count']}/{p['n']}", f"{p['same_answer_count']}/{p['n']}")
        out.print(t)
        d = c.get("at_paper_default")
        if d:
            ratio = "-" if d["kl_ratio"] is None else f"{d['kl_ratio']:.2f}×"
            out.print(f"  at the paper defaults' density ({pct(d['density'])}): mass KL {fmt(d['mass_kl_median'], 2)} "
                      f"vs paper {fmt(d['paper_kl_median'], 2)} ({ratio}; target ≤ "
                      f"{res['targets']['kl_ratio_at_paper_default']:g}×): {'met' if d['met'] else 'not met'}")
        w = c["within_noise"]
        if w["mass_point"] is None:
            out.print(f"  no mass setting is within {res['targets']['noise_multiple']:g}× the noise floor: not met")
        else:
            paper = (f"needs {pct(w['paper_density_for_same_kl'])}" if w["paper_reaches_that_kl"]
                     else "does not reach it in its range (more than its densest point)")
            out.print(f"  sparsest mass setting within {res['targets']['noise_multiple']:g}× the noise floor: "
                      f"{pct(w['mass_density'])} of the cells; for that KL the paper rule {paper}: gap "
                      f"{w['density_gap'] * 100:.1f} points (target ≥ {res['targets']['density_gap'] * 100:g}): "
                      f"{'met' if w['met'] else 'not met'}")
    verdict = "dominates" if res["mass_dominates_everywhere"] else "does not dominate"
    out.print(f"[bold]the mass rule {verdict} the paper rule on every set[/] (docs/evaluation.md says what follows)")
