"""Progress that moves on a CPU: the total is known before the first batch, and updates come as each layer of a
batch is done, never going back."""

import sift_cli.profile.job as job
from sift_cli.config import ProfileConfig
from sift_cli.profile.job import profile_corpus


def test_progress_total_first_then_per_layer_and_never_back(tmp_path, tiny_lm, small_corpus, monkeypatch):
    batches = []
    launch = job.launch_profile_batch

    def counted(*a, **k):
        batches.append(len(calls))
        return launch(*a, **k)

    monkeypatch.setattr(job, "launch_profile_batch", counted)
    calls = []
    report = profile_corpus(small_corpus, tmp_path / "s", tiny_lm, ProfileConfig(tile=16, batch_tokens=512),
                            num_shards=2, progress=lambda done, total: calls.append((done, total)))
    total = report.tokens
    assert calls[0] == (0, total) and batches[0] == 1  # the total before the first batch
    assert calls[-1] == (total, total) and all(t == total for _, t in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and len(set(done)) == len(done)
    # within each batch, as its layers finish: every layer of every batch moves it (its tokens differ)
    assert len(calls) == 1 + len(batches) * tiny_lm.n_layers, (calls, batches)


def test_prefill_progress_moves_within_a_forward_on_a_cpu(tiny_lm, monkeypatch, tmp_path):
    """On a CPU the prefill's progress counts forwards and moves by fractions of one as its layers finish; the
    answer's tokens, generated after the last forward, move nothing; no hook is left on the model."""
    import sift_cli.prefill.job as job
    from sift_cli.config import ProfileConfig as Config
    from sift_cli.prefill.layer_progress import decoder_layers
    from sift_cli.prefill.options import PrefillOptions

    profile_corpus_dir = tmp_path / "c"
    profile_corpus_dir.mkdir()
    for i in range(2):
        (profile_corpus_dir / f"d{i}.txt").write_text(f"document {i} about foxes and dogs " * 8)
    profile_corpus(profile_corpus_dir, tmp_path / "s", tiny_lm, Config(tile=16), num_shards=1)
    monkeypatch.setattr(job, "load_model", lambda *a, **k: tiny_lm)
    hooks_before = [len(layer._forward_hooks) for layer in decoder_layers(tiny_lm.model)]
    calls = []
    job.prefill_from_shards(tmp_path / "s", ["d0", "d1"], "What jumps?", device="cpu",
                            opts=PrefillOptions(backend="reference", max_new_tokens=3, repeat=1, warmup=0),
                            progress=lambda done, total: calls.append((done, total)))
    n = tiny_lm.n_layers
    per_forward = [(k / n, 2) for k in range(1, n)]
    assert calls == per_forward + [(1, 2)] + [(1 + x, t) for x, t in per_forward] + [(2, 2)], calls
    assert [len(layer._forward_hooks) for layer in decoder_layers(tiny_lm.model)] == hooks_before
