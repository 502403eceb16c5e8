"""The evaluations on the real bundled model, kept short (a few NQ passages); skipped without the NQ data."""

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(smol_cpu):
    return smol_cpu


@pytest.fixture(scope="module")
def nq_set():
    from sift_cli.errors import SiftError
    from sift_cli.lab.eval.prompt_sets import nq_prompt_set

    try:
        return nq_prompt_set(None, n_docs=3, n_prompts=1, seed=5)
    except SiftError:
        pytest.skip("NQ data not available (set SIFT_DATA_DIR)")


def test_recall_and_qa_on_three_passages(smol, nq_set, tmp_path):
    from sift_cli.lab.eval.prompt_sets import compose, ensure_shards
    from sift_cli.lab.eval.qa import run_qa
    from sift_cli.lab.eval.recall import run_recall
    from sift_cli.config import ProfileConfig

    shards = ensure_shards(nq_set, smol, ProfileConfig(), tmp_path / "work", num_shards=1)
    prompt = compose(shards, smol, nq_set.prompts[0])
    r = run_recall(smol, [prompt], 1e-3, 1e-2)["overall"]
    assert r["la_recall"] > 0.95 and r["ca_recall"] > 0.9 and r["attention_mass_kept"] > 0.99
    res = run_qa(smol, shards, nq_set, ("full", "sift", "cacheblend"), max_new_tokens=4)
    s = res["summary"]
    assert s["sift"]["first_token_agreement"] == 1.0 and s["sift"]["kl_mean"] < 0.05
    assert 0.1 < s["cacheblend"]["recomputed_share_mean"] < 0.2
