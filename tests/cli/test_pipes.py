"""Streaming commands whose reader goes away (`sift ids DIR | head -1`) end quietly with exit 0, through a real
pipe: a subprocess whose stdout is read for one line and closed while it still writes."""

import os
import subprocess
import sys
import textwrap

import pytest

# The listing and the statistics are replaced by large fakes so that the output outgrows the pipe's buffer
# without profiling a large set; the command, its printing and the entry point are the real ones.
_FAKES = textwrap.dedent("""
    import sys
    import sift_cli.shards.ids as ids
    import sift_cli.shards.inspection as inspection

    class Listing:
        def __init__(self, path):
            self.files, self.profiled, self.skipped = 1, 200_000, 0

        def __iter__(self):
            for i in range(200_000):
                yield {"doc_id": f"doc{i:07d}", "status": "profiled", "file": "part-00000.parquet", "n_tokens": 9}

    def inspect_shards(path, workers):
        row = {"layer": 0, "la_density": .5, "la_min": .1, "la_max": .9, "ca_density": .5, "ca_min": .1,
               "ca_max": .9}
        return {"path": path, "files": 1, "documents": 1, "tokens": 1, "tokens_min": 1, "tokens_max": 1,
                "tokens_mean": 1.0, "model": {"name": "m"}, "n_layers": 1, "n_heads": 1, "n_kv_heads": 1,
                "head_dim": 1, "tile_size": 16, "rule": "paper", "alpha": 0, "beta": 0, "gamma": 0, "tiles": 1,
                "pages": 1,
                "la_density": .5, "ca_density": .5, "metadata_bytes": 1, "shard_bytes_on_disk": 1,
                "kv_cache_bytes_bf16": 1, "kv_to_metadata_ratio": 1, "per_layer": [row] * 20_000}

    ids.DocIdListing = Listing
    inspection.inspect_shards = inspect_shards
    sys.argv = ["sift"] + sys.argv[1:]
    from sift_cli.cli import main
    main()
""")


@pytest.mark.parametrize("args", [["ids", "x"], ["ids", "x", "--json"], ["inspect", "x"], ["inspect", "x", "--json"]],
                         ids=["ids", "ids-json", "inspect", "inspect-json"])
def test_reader_going_away_ends_quietly_with_exit_0(args):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", _FAKES, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    first = proc.stdout.readline()  # what `head -1` reads, then it exits
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert first and "Traceback" not in err and "Broken pipe" not in err and "error" not in err, err
