"""`sift check-model`: does sparse prefill with every block listed reproduce the model's own forward?"""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from .console import err, out, print_json
from .options import DeviceOpt, DtypeOpt, JsonOpt, OnlineOpt, TrustOpt


def check_model(
    model: Optional[str] = typer.Argument(None, help="HF model id (offline cache), local directory or .gguf file; "
                                                     "default: the bundled SmolLM2-135M-Instruct GGUF"),
    backend: str = typer.Option("auto", "--backend", help="auto, gather, reference, flex or cuda"),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="prompt length (default: past the model's "
                                                                "smallest sliding window, at least 300)"),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    trust_remote_code: bool = TrustOpt,
    online: bool = OnlineOpt,
    as_json: bool = JsonOpt,
):
    """Sparse prefill with every causal block vs the model's own eager forward; exit 1 when max |Δlogit| is above
    the dtype's tolerance (a model sift cannot compute is refused at load, exit 2)."""
    from ..check_model import check_model as run_check
    from ..models import load_model

    if tokens is not None and tokens < 1:
        raise typer.BadParameter("--tokens must be at least 1")
    lm = load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code, online=online)
    r = run_check(lm, backend, tokens)
    if as_json:
        print_json(r)
    else:
        f = r["features"]
        windows = sorted({w for w in f["windows"] if w is not None})
        extras = ", ".join(filter(None, [f"windows {windows}" if windows else "",
                                         f"soft-cap {f['softcap']}" if f["softcap"] else "",
                                         "sinks" if f["sinks"] else ""])) or "plain causal"
        out.print(f"[bold]{escape(r['model'])}[/] ({f['model_type']}, head_dim {f['head_dim']}, {f['heads']}/"
                  f"{f['kv_heads']} heads, {extras}): backend {r['backend']}, {r['tokens']} tokens, {r['dtype']}")
        verdict = "[green]equal[/]" if r["ok"] else "[red]DIFFERENT[/]"
        why = (f": twice the {r['dtype']} rounding's own change, {r['half_precision_noise']:.3g}"
               if r.get("half_precision_noise") else "")
        out.print(f"max |Δlogit| {r['max_abs_dlogit']:.3g} (tolerance {r['tolerance']:.3g}{why}): {verdict}; "
                  f"next token {'equal' if r['first_token_equal'] else 'different'}")
    if not r["ok"]:
        err.print(f"[red]error:[/] sparse prefill differs from the model's forward: max |Δlogit| "
                  f"{r['max_abs_dlogit']:.3g} (tolerance {r['tolerance']:.3g}), next token "
                  f"{'equal' if r['first_token_equal'] else 'different'}")
        raise typer.Exit(1)
