"""One renderer per published table: a result object (`lab.results`) → a Markdown table of its rows."""

from __future__ import annotations

from .render import num, pct, ratio, table, tokens


def _ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "error" not in r]


def prefill(result: dict) -> str:
    """`sift bench prefill`: one line per (model, prompt, SIFT mode), the baselines of the same protocol beside."""
    rows = result["rows"]
    by_case: dict = {}
    for r in rows:
        by_case.setdefault((r.get("model"), r.get("pattern"), r.get("tokens")), {})[r.get("mode")] = r
    out = []
    for (model, pattern, n), modes in by_case.items():
        full, rest, blend = modes.get("full", {}), modes.get("no-attention", {}), modes.get("cacheblend", {})
        sifts = [m for m in modes if str(m).startswith("sift")] or [None]
        for mode in sifts:
            s = modes.get(mode, {}) if mode else modes.get("all", {})  # "all": the case failed or was skipped
            out.append([model, tokens(n), s.get("protocol") or full.get("protocol", "–"),
                        num(full.get("ttft_ms")), num(rest.get("ttft_ms")), pct(full.get("attention_share")),
                        mode or "–", s.get("error", num(s.get("ttft_ms")))[:60], ratio(s.get("speedup"), 2),
                        ratio(s.get("allowed_density")), ratio(s.get("cell_density")),
                        ratio(s.get("cells_over_allowed")), ratio(s.get("ttft_over_ideal")),
                        ratio(s.get("ttft_over_ideal_computed")),
                        blend.get("error", num(blend.get("ttft_ms")))[:40] if blend else "–",
                        num(s.get("energy_j"), 2), num(full.get("energy_j"), 2)])
    return table(["model", "tokens", "protocol", "full ms", "no-attention ms", "attention share", "SIFT mode",
                  "SIFT ms", "× full", "allowed density", "cell density", "cells/allowed", "TTFT / ideal (bits)",
                  "TTFT / ideal (computed)", "CacheBlend ms", "SIFT J", "full J"], out)


def _attention(rows, documents: bool):
    """The sparse implementations' rows on document layouts (`documents`) or on causal ones."""
    return [r for r in _ok(rows) if r.get("kind") == "attention" and r.get("impl") not in (None, "cuDNN SDPA")
            and (r.get("layout", "causal") != "causal") == documents]


def _grouped(rows):
    """Rows of one configuration (shape, L, blocks, layout, timing) together, by implementation."""
    groups: dict = {}
    for r in rows:
        key = (r["H"], r["H_kv"], r["D"], r["L"], r.get("block_m"), r.get("block_n"), r.get("layout"),
               r.get("timing", "eager"), round(r.get("density", 0), 4))
        groups.setdefault(key, {})[r["impl"]] = r
    return groups


def _cudnn(rows, H, D, L, timing):
    for r in _ok(rows):
        if (r.get("impl") == "cuDNN SDPA" and r["H"] == H and r["D"] == D and r["L"] == L
                and r.get("timing", "eager") == timing):
            return r
    return {}


def kernels_documents(result: dict) -> str:
    """`sift bench kernels` on document layouts: the kernel beside Flex on the same blocks and dense cuDNN."""
    rows = result["rows"]
    out = []
    for (H, H_kv, D, L, bm, bn, layout, timing, _), impls in _grouped(_attention(rows, True)).items():
        s, f = impls.get("SIFT cuda", {}), impls.get("FlexAttention", {})
        out.append([f"{H}/{H_kv}/{D}", tokens(L), layout, f"{bm}×{bn}", pct(s.get("density"), 0),
                    ratio(s.get("cells_over_allowed")), timing, num(_cudnn(rows, H, D, L, timing).get("ms"), 3),
                    num(s.get("ms"), 3), num(f.get("ms"), 3) if f.get("ms") else (f.get("note") or "–")[:40],
                    ratio(s.get("speedup_vs_flex"), 2), num(s.get("tflops"), 0), num(f.get("tflops"), 0),
                    "–" if f.get("agree") is None else f"{f['agree']:.1e}"])
    return table(["H/H_kv/D", "L", "layout", "Q×KV block", "density", "cells/allowed", "timing", "cuDNN dense ms",
                  "SIFT ms", "Flex ms", "Flex ÷ SIFT", "SIFT TFLOP/s", "Flex TFLOP/s", "Flex vs SIFT (rel. diff)"],
                 out)


def kernels_causal(result: dict) -> str:
    """`sift bench kernels` on causal layouts: throughput per computed tile against dense cuDNN."""
    rows = result["rows"]
    out = []
    for (H, H_kv, D, L, bm, bn, _, timing, dens), impls in _grouped(_attention(rows, False)).items():
        s, f = impls.get("SIFT cuda", {}), impls.get("FlexAttention", {})
        cudnn = _cudnn(rows, H, D, L, timing)
        out.append([f"{H}/{H_kv}/{D}", tokens(L), f"{bm}×{bn}", pct(dens, 0), timing, num(cudnn.get("ms"), 3),
                    num(cudnn.get("tflops"), 0), num(s.get("ms"), 3), num(s.get("tflops"), 0),
                    num(s.get("pct_of_cudnn"), 0), num(f.get("ms"), 3), ratio(s.get("speedup_vs_flex"), 2)])
    return table(["H/H_kv/D", "L", "Q×KV block", "density", "timing", "cuDNN ms", "cuDNN TFLOP/s", "SIFT ms",
                  "SIFT TFLOP/s", "% of cuDNN", "Flex ms", "Flex ÷ SIFT"], out)


def decode(result: dict) -> str:
    out = [[f"{r['layers']}×{r['heads']}", tokens(r["L"]), r.get("timing", "–"), num(r.get("ctas")),
            num(r.get("ms_per_layer"), 4), num(r.get("ms_all_layers"), 3)]
           for r in _ok(result["rows"]) if r.get("kind") == "decode"]
    return table(["layers × heads", "L", "timing", "CTAs", "ms / layer", "ms, all layers"], out)


def profile(result: dict) -> str:
    """`sift bench profile`: document tokens/s of `sift profile` against dense prefill on the same documents."""
    out = []
    for r in result["rows"]:
        if "error" in r:
            out.append([r.get("model", ""), r.get("case", ""), "failed", "", "", "", "", ""])
            continue
        out.append([r["model"], r["case"], num(r.get("docs")), num(r.get("mean_tokens"), 0),
                    num(r.get("dense_tok_s"), 0), num(r.get("profile_triton_tok_s"), 0),
                    ratio(r.get("ratio_triton"), 2), num(r.get("profile_torch_tok_s"), 0)])
    return table(["model", "documents", "docs", "mean tokens", "dense prefill tok/s", "profile (triton) tok/s",
                  "÷ dense", "profile (torch) tok/s"], out)


def store(result: dict) -> str:
    """`sift bench store`: a request's bits from sets of 10⁴–10⁶ documents, the serving store beside Parquet."""
    out = []
    for r in result["rows"]:
        for path in ("store", "parquet"):
            p = r.get(path, {})
            if "error" in p:
                out.append([num(r["documents"]), path, f"error: {p['error']}"[:60]] + [""] * 7)
                continue
            out.append([num(r["documents"]), path, num(p.get("open_ms"), 2), num(p.get("new_process_ms"), 0),
                        num(p.get("warm_p50_ms"), 3), num(p.get("warm_p99_ms"), 3), num(p.get("cold_p50_ms"), 2),
                        num(p.get("cold_p99_ms"), 2), num(p.get("rss_mib_after_open"), 0),
                        num(p.get("peak_rss_mib"), 0)])
    return table(["documents", "read path", "open ms", "new process → 1st request ms", "warm p50 ms", "warm p99 ms",
                  "cold p50 ms", "cold p99 ms", "RSS after open MiB", "peak RSS MiB"], out)


def rows_table(columns: list[tuple[str, str, int]]):
    """A renderer of chosen row keys: columns of (header, key, decimals); for results whose rows are flat (an
    evaluation's owner picks the columns in `published`)."""
    def render(result: dict) -> str:
        return table([c[0] for c in columns],
                     [[num(r.get(key), nd) for _, key, nd in columns] for r in result["rows"]])

    return render


def _results(result: dict) -> list[dict]:
    """Each result a table is rendered from (`pages.block` merges several as "results"), or the one given."""
    return result.get("results") or [result]


def store_lookup(result: dict) -> str:
    """`sift bench prefill --corpus-docs N`: SIFT's TTFT with the prompt's bits looked up in a set's serving store
    inside it, the lookup's share beside full recompute."""
    rows = _ok(result["rows"])
    full = {(r.get("cuda_graphs"), r["tokens"]): r for r in rows if r.get("mode") == "full"}
    out = []
    for r in rows:
        if not str(r.get("mode", "")).startswith("sift"):
            continue
        f = full.get((r.get("cuda_graphs"), r["tokens"]), {})
        out.append([r.get("protocol") or ("graphed" if r.get("cuda_graphs") else "eager"), tokens(r["tokens"]),
                    num(r.get("docs"), 0), num(f.get("ttft_ms")), num(r.get("ttft_ms")), num(r.get("lookup_ms"), 3),
                    pct((r.get("lookup_ms") or 0) / r["ttft_ms"] if r.get("ttft_ms") else None, 2),
                    num(r.get("transfer_ms"), 2), ratio(r.get("cell_density"))])
    return table(["protocol", "tokens", "documents", "full ms", "SIFT ms", "lookup ms", "lookup / SIFT TTFT",
                  "transfer ms", "cell density"], out)


def frontier(result: dict) -> str:
    """`sift eval frontier`: per prompt set and rule, computed density against KL, beside the set's noise floor."""
    out = []
    for s in (s for res in _results(result) for s in res.get("sets", [])):
        nf = s["noise_floor"]
        out.append([s["set"], f"noise floor (full {nf['reference_dtype']})", "100.0 %", num(nf["kl_median"], 4),
                    num(nf["kl_p90"], 4), "1×", f"{nf['first_token_same_count']}/{nf['n']}",
                    f"{nf['same_answer_count']}/{nf['n']}"])
        for rule, points in s["rules"].items():
            for p in sorted(points, key=lambda p: p["density"]):
                params = (f"ε={p['epsilon']:g} ε'={p['ca_epsilon']:g}" if rule == "mass"
                          else f"α={p['alpha']:g} β={p['beta']:g} γ={p['gamma']:g}")
                m = p.get("kl_over_noise_median")
                out.append([s["set"], f"{rule} T={p['tile_size']} {params}", pct(p["density"]),
                            num(p["kl_median"], 4), num(p["kl_p90"], 4), "–" if m is None else f"{m:.2g}×",
                            f"{p['first_token_same_count']}/{p['n']}", f"{p['same_answer_count']}/{p['n']}"])
    return table(["set", "rule", "cells computed", "KL median", "KL p90", "× noise", "same first token",
                  "same answer"], out)


def recall(result: dict) -> str:
    """`sift eval recall`, one row per prompt set and side: the truly high cells (LA ≥ α, CA ≥ β) the stored bits
    and the computed blocks keep, the attention mass the blocks keep, beside the paper's Llama-3-8B recall."""
    out = []
    for res in _results(result):
        o, paper, src = res["overall"], res.get("paper") or {}, res.get("source") or {}
        tok = [p["tokens"] for p in res.get("prompts", [])]
        name = f"{src.get('name', '?')} ({len(tok)} prompts, {tokens(min(tok))}–{tokens(max(tok))})" if tok else "?"
        for side, unit in (("la", "tile"), ("ca", "page")):
            out.append([name, side.upper(), pct(res["area"][side]), pct(o[f"{side}_true_density"], 2),
                        pct(o[f"{side}_chosen_density"]),
                        f"{pct(o[f'{side}_chosen_{unit}_density'])} / {pct(o[f'{side}_true_{unit}_density'])}",
                        pct(o[f"{side}_recall"], 2), pct(o[f"{side}_block_recall"], 2),
                        pct(o.get("attention_mass_kept"), 2), pct(paper.get(f"{side}_recall"), 2)])
    return table(["prompts", "side", "share of the attention area", "truly high cells", "chosen cells",
                  "chosen / truly high tiles (LA) or pages (CA)", "recall", "recall in computed blocks",
                  "document-row mass in computed blocks", "paper recall (Llama-3-8B)"], out)


def sweep(result: dict) -> str:
    """`sift eval sweep`: per prompt set and (T, α, β, γ) point, the cells computed and what the answers keep."""
    out = []
    for res in _results(result):
        ps = res.get("prompt_set") or {}
        first = (res.get("dense") or [{}])[0].get("tokens")
        name = f"{ps.get('name', '?')} ({ps.get('prompts', '?')} prompts, {tokens(first)} in the first)"
        for p in res.get("points", []):
            out.append([name, f"{p['tile_size']}, {p['alpha']:g}, {p['beta']:g}, {p['gamma']:g}", pct(p["density"]),
                        pct(p["block_density"]), pct(p["la_bit_density"]), pct(p["ca_bit_density"]),
                        f"{p['kl_mean']:.1e}", f"{p['kl_max']:.1e}", f"{p['first_token_same_count']}/{p['n']}",
                        f"{p['same_answer_count']}/{p['n']}"])
    return table(["prompts", "T, α, β, γ", "cells computed", "blocks computed", "LA bits set", "CA bits set",
                  "KL mean", "KL max", "same first token", "same 16-token answer"], out)


QA_MODES = ("full", "sift", "sink+window", "kv-reuse", "cacheblend", "noise_floor")


def _flag(command: str, name: str) -> str | None:
    words = (command or "").split()
    return words[words.index(name) + 1] if name in words[:-1] else None


def qa(result: dict) -> str:
    """`sift eval qa --nq`: per passage count and mode, accuracy and agreement with full recompute (same answer,
    same first token, median KL, its multiple of the noise floor), beside the noise floor's own."""
    out = []
    for res in _results(result):
        command = res.get("command") or ""
        config = f"{_flag(command, '--dtype') or 'auto'} + {_flag(command, '--backend') or 'auto'}"
        for run in res.get("runs", []):
            for mode in QA_MODES:
                m = run.get("summary", {}).get(mode)
                if not m:
                    continue
                vs_full = mode != "full"
                label = f"noise floor (full {m['reference_dtype']})" if mode == "noise_floor" else mode
                multiple = m.get("kl_over_noise_median")
                out.append([num(run["n_docs"], 0), config, num(m["n"], 0), tokens(round(run.get("mean_tokens", 0))),
                            label, pct(m["accuracy"]), pct(m["agreement_with_full"]) if vs_full else "–",
                            pct(m["first_token_agreement"]) if vs_full else "–",
                            f"{m['kl_median']:.1e}" if vs_full else "–",
                            "–" if multiple is None or not vs_full else f"{multiple:.2g}×",
                            pct(m.get("cell_density_mean"))])
    return table(["passages", "config", "questions", "tokens (mean)", "mode", "accuracy", "same answer as full",
                  "same first token", "KL median", "KL × noise floor", "cells computed"], out)


STORAGE_MODELS = ("Llama-3-8B", "Qwen3-235B-A22B", "MiniMax-M2", "SmolLM2-135M")


def storage(result: dict) -> str:
    """`sift eval storage` (one result per tile size): a document's bits, byte-padded as stored (the paper's
    unpadded arithmetic in brackets), against its bf16 KV cache, at 1K and 2K tokens, and the document length at
    which the two are equal."""
    from ...sizes import binary_bytes

    out = []
    for res in _results(result):
        for r in res.get("models", []):
            if r["model"] not in STORAGE_MODELS or r["doc_tokens"] not in (1024, 2048):
                continue
            ratios = f"{r['kv_over_sift']:,.0f}× ({r['kv_over_sift_unpadded']:,.0f}×)"
            out.append([r["model"], str(r["tile"]), tokens(r["doc_tokens"]), binary_bytes(r["sift_bytes"]),
                        binary_bytes(r["kv_bytes"]), ratios,
                        f"{r['crossover_doc_tokens'] / 1e6:.1f}M tokens"])
    return table(["model", "T", "doc tokens", "SIFT", "KV cache (bf16)", "KV / SIFT", "equal at"], out)


def gather(result: dict) -> str:
    """`sift bench gather`: the CPU's sparse path (gather backend) against full recompute on real profiles, medians
    of interleaved warm runs, with the cells SIFT computed."""
    out = []
    for r in _ok(result["rows"]):
        out.append([tokens(r["tokens"]), num(r["docs"], 0), pct(r["cells"]), num(r["full_ms"] / 1e3, 2),
                    num(r["sift_ms"] / 1e3, 2), ratio(r.get("speedup"), 2),
                    "yes" if r.get("first_token_match") else "no",
                    "–" if r.get("kl") is None else f"{r['kl']:.1e}"])
    return table(["prompt tokens", "documents", "cells computed", "full recompute s", "SIFT (gather) s",
                  "× full", "same first token", "KL(full ‖ SIFT)"], out)


def store_scans(result: dict) -> str:
    """`sift bench store`'s full scans of each set: seconds and peak resident memory."""
    names = ("validate", "inspect", "ids --json", "status --finalize")
    out = []
    for r in result["rows"]:
        scans = {s["scan"]: s for s in r.get("scans", [])}
        out.append([num(r["documents"])] + [
            "–" if n not in scans else (f"exit {scans[n]['exit']}" if scans[n].get("exit")
                                        else f"{num(scans[n]['seconds'])} s, {num(scans[n]['peak_rss_mib'], 0)} MiB")
            for n in names])
    return table(["documents"] + [f"{n} (time, peak RSS)" for n in names], out)
