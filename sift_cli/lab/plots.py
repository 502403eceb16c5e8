"""Figures for `--plot FILE.png` (matplotlib is an optional extra: `pip install 'sift-cli[plot]'`)."""

from __future__ import annotations

from pathlib import Path

from ..errors import SiftError


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SiftError("--plot needs matplotlib: pip install 'sift-cli[plot]' (or pip install matplotlib)") from exc
    return plt


def check_available() -> None:
    """Raise the one-line error now when matplotlib is missing (before a measurement, not after it)."""
    _plt()


def _save(fig, path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=130)
    return p


def plot_recall(result: dict, path) -> Path:
    """Per layer: chosen LA tile density with the inter-quartile range across heads (Fig. 17), true tile density,
    CA page density; and LA / CA recall."""
    plt = _plt()
    rows = result["per_layer"]
    x = [r["layer"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    med = [r["la_tile_density_heads"]["median"] for r in rows]
    a.plot(x, med, label="LA chosen (median over heads)")
    a.fill_between(x, [r["la_tile_density_heads"]["q1"] for r in rows], [r["la_tile_density_heads"]["q3"] for r in rows],
                   alpha=0.3, label="LA IQR across heads")
    a.plot(x, [r["la_true_tile_density"] or 0 for r in rows], "--", label="LA truly high tiles")
    a.plot(x, [r["ca_chosen_page_density"] or 0 for r in rows], label="CA chosen pages")
    a.set_xlabel("layer")
    a.set_ylabel("density")
    a.set_ylim(0, 1.02)
    a.legend(fontsize=8)
    b.plot(x, [r["la_recall"] or 0 for r in rows], label="LA recall")
    b.plot(x, [r["ca_recall"] or 0 for r in rows], label="CA recall")
    b.axhline(0.9389, ls=":", c="gray", label="paper LA 93.89%")
    b.axhline(0.8012, ls="-.", c="gray", label="paper CA 80.12%")
    b.set_xlabel("layer")
    b.set_ylabel("recall of truly high cells")
    b.set_ylim(0, 1.02)
    b.legend(fontsize=8)
    return _save(fig, path)


def plot_sweep(result: dict, path) -> Path:
    """Sensitivity: density against KL and agreement for each grid point (Fig. 16)."""
    plt = _plt()
    pts = result["points"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for t in sorted({p["tile_size"] for p in pts}):
        sel = [p for p in pts if p["tile_size"] == t]
        a.scatter([p["density"] for p in sel], [max(p["kl_mean"], 1e-9) for p in sel], label=f"T={t}")
        b.scatter([p["density"] for p in sel], [p["first_token_agreement"] for p in sel], label=f"T={t} first token")
        b.scatter([p["density"] for p in sel], [p["same_answer"] for p in sel], marker="x",
                  label=f"T={t} same answer")
        for p in sel:
            a.annotate(f"α{p['alpha']:g} β{p['beta']:g} γ{p['gamma']:g}", (p["density"], max(p["kl_mean"], 1e-9)),
                       fontsize=6)
    a.set_yscale("log")
    a.set_xlabel("computed share of causal cells")
    a.set_ylabel("KL(full ‖ SIFT), last position")
    b.set_xlabel("computed share of causal cells")
    b.set_ylabel("agreement with full recompute")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    return _save(fig, path)


def plot_qa(result: dict, path) -> Path:
    plt = _plt()
    runs = result["runs"] if "runs" in result else [result]
    modes = runs[0]["modes"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        s = run["summary"]
        ax.bar([m + i * width for m in range(len(modes))], [s.get(m, {}).get("accuracy") or 0 for m in modes],
               width, label=f"{run.get('n_docs', '')} documents")
    ax.set_xticks([m + width * (len(runs) - 1) / 2 for m in range(len(modes))], modes)
    ax.set_ylabel("accuracy")
    ax.legend()
    return _save(fig, path)


def plot_bench(rows: list[dict], path) -> Path:
    """TTFT against prompt length per mode (Fig. 14), one panel per model/pattern."""
    plt = _plt()
    groups: dict = {}
    for r in rows:
        if "ttft_ms" in r:
            groups.setdefault((r["model"], r["pattern"]), []).append(r)
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(6 * max(1, len(groups)), 4), squeeze=False)
    for ax, ((model, pattern), rs) in zip(axes[0], groups.items()):
        for mode in sorted({r["mode"] for r in rs}):
            sel = sorted((r for r in rs if r["mode"] == mode), key=lambda r: r["tokens"])
            ax.plot([r["tokens"] for r in sel], [r["ttft_ms"] for r in sel], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT ms")
        ax.set_title(f"{model}\n{pattern}", fontsize=8)
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_storage(result: dict, path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for model in sorted({r["model"] for r in result["models"]}):
        sel = [r for r in result["models"] if r["model"] == model]
        ax.plot([r["doc_tokens"] for r in sel], [r["kv_over_sift"] for r in sel], marker="o", label=model)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("document tokens")
    ax.set_ylabel("KV bytes / SIFT bytes")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_frontier(result: dict, path) -> Path:
    """Per prompt set: computed cell density against median KL, one line per rule, the noise floor and 2× it."""
    plt = _plt()
    sets = result["sets"]
    fig, axes = plt.subplots(1, len(sets), figsize=(4.5 * len(sets), 4), squeeze=False)
    for ax, r in zip(axes[0], sets):
        for rule, points in r["rules"].items():
            pts = sorted(points, key=lambda p: p["density"])
            ax.plot([p["density"] for p in pts], [max(p["kl_median"], 1e-9) for p in pts], "o-", label=rule)
        floor = max(r["noise_floor"]["kl_median"], 1e-9)
        ax.axhline(floor, ls=":", c="gray", label="noise floor")
        ax.axhline(2 * floor, ls="--", c="gray", label="2× noise floor")
        ax.set_yscale("log")
        ax.set_title(r["set"])
        ax.set_xlabel("computed share of causal cells")
        ax.set_ylabel("median KL(full ‖ SIFT)")
        ax.legend(fontsize=8)
    return _save(fig, path)
