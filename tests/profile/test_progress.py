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
