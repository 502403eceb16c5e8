"""The fault matrix: every writer × every stage a test can reach, the concurrent pairs and the resource faults.
docs/concurrency.md carries this table (`matrix_table`; a test checks the two agree)."""

from __future__ import annotations

STAGES = {
    # sift profile: a worker writing part files, their store copies, then the manifest and the store
    "profile": ["part:before-write", "part:before-rename", "part:after-rename", "bucket:before-write",
                "bucket:before-rename", "bucket:after-rename", "store-header:before-rename", "manifest:locked",
                "manifest:before-rename", "manifest:after-rename"],
    # sift prefill --profile-missing: a document added to a finished set
    "additions": ["part:before-write", "part:before-rename", "part:after-rename", "bucket:before-rename",
                  "bucket:after-rename", "manifest:locked", "manifest:before-rename", "manifest:after-rename"],
    # sift status --finalize: the manifest and a store built from the part files
    "finalize": ["manifest:locked", "manifest:before-rename", "manifest:after-rename", "store-header:before-rename",
                 "bucket:before-write", "bucket:before-rename", "bucket:after-rename"],
    # sift index: the serving store rebuilt
    "index": ["manifest:locked", "store-header:before-rename", "store-header:after-rename", "bucket:before-write",
              "bucket:before-rename", "bucket:after-rename"],
    # sift calibrate writing sift.toml
    "calibrate": ["config:before-write", "config:before-rename", "config:after-rename"],
    # a GGUF checkpoint converted into the cache
    "gguf": ["gguf:converting", "gguf:converted", "gguf:renamed"],
}

PAIRS = ["two profilers", "profiler + adder", "adder + finalize", "two adders", "reader + adder"]
RESOURCES = [("profile", "full disk"), ("additions", "full disk"), ("calibrate", "full disk")]

KILL_CASES = [(w, s) for w, stages in STAGES.items() for s in stages]

OUTCOMES = {
    "kill": "killed at the stage; validate passes or names the damage; a re-run completes it: valid, rows equal "
            "to an uninterrupted run's, every document served, no leftovers",
    "pair": "both finish; valid, rows equal to the sequential runs', every document served, no leftovers",
    "full disk": "refused with an error, nothing half-written in place; a re-run with room completes it as above",
}


def matrix_table() -> str:
    """The matrix as a Markdown table (writer × fault × outcome)."""
    lines = ["| writer | fault | outcome |", "|---|---|---|"]
    for writer, stages in STAGES.items():
        lines.append(f"| {writer} | SIGKILL at {', '.join(f'`{s}`' for s in stages)} ({len(stages)} cases) "
                     f"| {OUTCOMES['kill']} |")
    for pair in PAIRS:
        lines.append(f"| {pair} | run concurrently | {OUTCOMES['pair']} |")
    for writer, fault in RESOURCES:
        lines.append(f"| {writer} | {fault} (RLIMIT_FSIZE) | {OUTCOMES['full disk']} |")
    total = len(KILL_CASES) + len(PAIRS) + len(RESOURCES)
    lines.append(f"\n{total} cases: {len(KILL_CASES)} kills, {len(PAIRS)} concurrent pairs, {len(RESOURCES)} "
                 f"resource faults.")
    return "\n".join(lines) + "\n"
