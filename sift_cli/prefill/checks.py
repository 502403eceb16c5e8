"""Every input check of `sift prefill` and `sift demo-prefill` that needs no model, run before it loads (seconds
against a model load of seconds to minutes): the options, the backend and device, the documents named (repeats,
ids no set holds), the shard sets (opened here, and returned for the prefill to use) and the `--profile-missing`
folder (writable, and holding bits of the same kind if it holds any)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..attention.backends import get_backend
from ..corpus import Document
from ..errors import SiftError
from ..models import resolve_device
from ..output_dirs import check_writable_dir
from ..shards.files import ShardFile, list_parts
from .assemble import doc_id_of, missing_ids_error
from .lookup import check_same_kind, open_sets_timed
from .options import PrefillOptions, check_options

SAME_KIND_KEYS = ("sift.tile_size", "sift.alpha", "sift.beta", "sift.gamma", "sift.prefix_token_ids")


def check_prefill_inputs(shards_dir: str | Path, docs: list[str | Document], opts: PrefillOptions,
                         device: str | None = "auto", profile_missing: str | Path | None = None
                         ) -> tuple[list, dict]:
    """Check everything of a prefill the model is not needed for; the sets the prompt reads, opened, and what
    opening them cost (`lookup.open_sets_timed`)."""
    check_options(opts)
    get_backend(opts.backend, resolve_device(device))
    check_no_repeats(docs)
    if profile_missing is not None:
        check_writable_dir(profile_missing, "--profile-missing")
    sets, opened = open_sets_timed(shards_dir, profile_missing)
    check_same_kind(sets)
    check_ids_held(sets, [d for d in docs if not isinstance(d, Document)])
    if profile_missing is not None:
        check_unfinished_destination(Path(profile_missing), sets[0])
    return sets, opened


def check_no_repeats(docs: list[str | Document]) -> None:
    """Refuse a prompt naming a document twice: a retriever's duplicate is a bug to see, not a document to pay for
    twice (docs/cli.md)."""
    counts = Counter(doc_id_of(d) for d in docs)
    repeated = [f"{d!r} ({n} times)" for d, n in counts.items() if n > 1]
    if repeated:
        raise SiftError(f"--docs names {', '.join(repeated[:5])}{' …' if len(repeated) > 5 else ''} more than once "
                        f"— a prompt holds each document once; remove the repeats")


def check_ids_held(sets: list, doc_ids: list[str]) -> None:
    """Every id (documents given by id, not as text) is held by one of the sets: point reads in a serving store."""
    missing = list(doc_ids)
    for s in sets:
        missing = s.missing(missing) if missing else missing
    if missing:
        raise missing_ids_error(sets, missing)


def check_unfinished_destination(out: Path, first) -> None:
    """Part files already in the `--profile-missing` folder (a set not finished yet, which the prompt does not read)
    were made with the tile, thresholds and prefix of the set the prompt is assembled from. (The model is compared
    once it is loaded: `missing.check_destination`.)"""
    if Path(out).resolve() == Path(first.dir).resolve():
        return
    parts = list_parts(out) if out.is_dir() else []
    if not parts:
        return
    meta = ShardFile.open(parts[0]).meta
    for key in SAME_KIND_KEYS:
        if meta.get(key) != first.meta.get(key):
            raise SiftError(f"--profile-missing {out}: holds shards made with another {key.removeprefix('sift.')} "
                            f"({meta.get(key)!r}) than {first.dir} ({first.meta.get(key)!r}) — give another folder")
