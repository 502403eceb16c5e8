"""The checks of `sift profile`'s output folder that need no model, run before it loads: the folder can be written,
and shards already in it were made with the tile and thresholds asked for (a resumed run continues a set; it
never mixes two kinds of bits). The model, tokenizer and prefix are compared once the model is loaded
(`job.check_compatible`)."""

from __future__ import annotations

from pathlib import Path

from ..config import ProfileConfig
from ..errors import SiftError
from ..output_dirs import check_writable_dir
from ..shards.files import ShardFile, list_parts

CONFIG_KEYS = {"sift.tile_size": "tile", "sift.alpha": "alpha", "sift.beta": "beta", "sift.gamma": "gamma"}


def check_out_before_model(out: str | Path, cfg: ProfileConfig) -> None:
    check_writable_dir(out, "--out")
    parts = list_parts(Path(out)) if Path(out).is_dir() else []
    if not parts:
        return
    try:
        meta = ShardFile.open(parts[0]).meta
    except SiftError:
        return  # an unreadable part is the job's to redo
    for key, field in CONFIG_KEYS.items():
        theirs, ours = meta.get(key), getattr(cfg, field)
        if theirs is not None and theirs != ours:
            raise SiftError(f"{out}: holds shards made with {field} {theirs!r}, not {ours!r} — pass --{field} "
                            f"{theirs} to resume that set, or use another --out directory")
