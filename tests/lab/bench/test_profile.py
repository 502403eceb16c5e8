"""`sift bench profile` data side on CPU with tiny models: rows, both model kinds, the table."""

import torch

from sift_cli.lab.bench import profile as bp


def test_bench_case_on_the_tiny_model(tmp_path, tiny_lm):
    from tests.helpers import TRAINING_TEXT

    recs = [{"id": f"d{i}", "title": "T", "text": " ".join(TRAINING_TEXT[: 1 + i % 5])} for i in range(6)]
    row = bp.bench_case(tiny_lm, "tiny", "prose", recs, tmp_path, stats_paths=("torch", "torch"),
                        batch_tokens=2048, repeat=1, log=lambda *_: None)
    assert row["docs"] == 6 and row["tokens"] > 0 and row["dense_tok_s"] > 0
    assert row["profile_torch_tok_s"] > 0 and 0 < row["ratio_torch"]
    table = bp.render([row, {"model": "m", "case": "c", "error": "RuntimeError: boom"}])
    assert table.row_count == 2
    assert "dense" in bp.plain_table([row]) and "ERROR" in bp.plain_table([{"model": "m", "case": "c",
                                                                              "error": "x"}])


def test_random_llama_with_id_tokenizer_profiles_random_docs(tmp_path):
    from sift_cli.corpus import CorpusFormat

    cfg = dict(bp.LLAMA3_8B_CONFIG, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=3000,
               max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    lm = bp.random_llama(cfg, device="cpu", dtype=torch.float32)
    assert lm.n_layers == 2 and lm.max_context == 256
    recs = bp.random_id_records(3, 100, 3000)
    row = bp.bench_case(lm, "random", "100-token", recs, tmp_path, stats_paths=("torch",), batch_tokens=4096,
                        fmt=CorpusFormat(template="{text}"), prefix_text="", repeat=1, log=lambda *_: None)
    assert row["docs"] == 3 and row["tokens"] == 300 and row["profile_torch_tok_s"] > 0


def test_llama3_8b_config_is_the_published_one():
    c = bp.LLAMA3_8B_CONFIG
    assert (c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"],
            c["intermediate_size"], c["vocab_size"], c["rope_theta"]) == (32, 32, 8, 4096, 14336, 128256, 500000.0)
