"""Storage arithmetic against the paper's numbers."""

import math

from sift_cli.lab.eval.storage import crossover_tokens, kv_bytes, model_table, prompt_table, sift_bytes


def test_storage_arithmetic_matches_the_paper():
    # Llama-3-8B, 1K-token document, T = 128: P = 8 → LA 36 bits (5 bytes), CA 8 bits (1 byte)
    assert sift_bytes(1024, 32, 32, 128) == 6 * 1024
    assert kv_bytes(1024, 32, 8, 128) == 1024 * 131072
    row = [r for r in model_table({"Llama-3-8B": (32, 32, 8, 128)}, (1024,), 128)][0]
    assert round(row["kv_over_sift"]) == 21845 and round(row["kv_over_sift_unpadded"]) == 23831  # paper: ~24,000×
    cross = crossover_tokens(32, 32, 8, 128, 128, padded=False)
    assert 33.0e6 < cross < 34.0e6  # paper: equal at 33.6M tokens
    mb = {r["prompt_tokens"]: r["sift_bytes"] / 1e6 for r in prompt_table({"Llama-3-8B": (32, 32, 8, 128)})}
    assert [round(mb[k], 1) for k in (15360, 32768, 65536)] == [1.1, 2.3, 4.6]  # paper: 1.0 / 2.5 / 4.5 MB
    assert math.isclose(sift_bytes(100, 1, 1, 64, padded=False), (2 * 3 / 2 + 2) / 8)
