"""One recovery story: each state a shard set can be left in by a run that went wrong, and the one piece of advice
for it, given alike by `sift status`, `sift validate`, `sift profile` and docs/cli.md ("When a run went wrong").
A test follows each advice and checks the set is whole afterwards."""

from __future__ import annotations

from pathlib import Path

# state → advice; {dir} is the set's folder, {file} the file concerned
ADVICE = {
    "unreadable-part": "re-run `sift profile` with the same arguments: it sets {file} aside (as {file}.unreadable), "
                       "profiles its bucket again and keeps the documents added to it",
    "interrupted-run": "re-run `sift profile` with the same arguments: finished shards are kept, the others are "
                       "profiled",
    "manifest-missing": "run `sift status {dir} --finalize`",
    "foreign-file": "move {file} out of {dir}",
    "stale-store": "run `sift index {dir}`",
    "set-aside": "{file} was set aside and its bucket profiled again; delete it once you no longer need it",
}


def advice(state: str, directory: str | Path = "DIR", file: str = "FILE") -> str:
    """The advice for a state of the set in `directory`."""
    return ADVICE[state].format(dir=directory, file=file)


def advice_table() -> str:
    """docs/cli.md's table of states and advice (a test checks the two agree)."""
    what = {
        "unreadable-part": "a part file is truncated or corrupt (`status`: unreadable; `validate`: `file-unreadable`)",
        "interrupted-run": "shards are missing (a run was killed or is still going; `status` exits 3; `validate`: "
                           "`shards-missing`)",
        "manifest-missing": "every shard is done but there is no manifest (`validate`: `manifest-missing`)",
        "foreign-file": "a Parquet file that is not the set's (`validate`: `foreign-file`)",
        "stale-store": "the serving store is older than a part file (`validate`: `store-stale`)",
        "set-aside": "`part-NNNNN.parquet.unreadable` beside the set (`sift profile` set it aside)",
    }
    lines = ["| state | advice |", "|---|---|"]
    lines += [f"| {what[s]} | {advice(s)} |" for s in ADVICE]
    return "\n".join(lines) + "\n"
