"""`sift calibrate`'s advice when no candidate meets the target: one sentence per measure, none left empty."""

from sift_cli.lab.eval.calibrate import Target, advice


def _row(density, kl, agreement, recall=None):
    return {"density": density, "kl_mean": kl, "first_token_agreement": agreement, "recall": recall,
            "alpha": 1e-3, "beta": 1e-2, "gamma": 0.1}


def test_advice_names_what_each_target_reached():
    rows = [_row(0.6, 0.2, 0.7), _row(0.8, 0.05, 0.9)]
    text = advice(Target(max_kl=0.01, min_agreement=0.95), rows)
    assert text.startswith("KL 0.05 at best") and "first-token agreement 90% at best" in text
    assert "the densest candidate computes 80% of the cells" in text and "smaller --alphas" in text


def test_advice_without_a_measured_value_starts_with_the_density():
    """A recall target on candidates with no recall measured gives no recall sentence, and no stray separator."""
    text = advice(Target(min_recall=0.9), [_row(0.99, 0.0, 1.0)])
    assert text.startswith("the densest candidate already computes 99%") and "; " not in text
