import os
import shutil

import pytest
import torch

# pytest-xdist's workers set COLUMNS=80, which rich takes as an explicit width: the CLI's output off a terminal must
# look as it does for a user's log file or pipe, whichever runner runs the tests
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# Under pytest-xdist (`make test` runs a worker per core) each worker, and the `sift` processes its tests start, use
# one intra-op thread: two workers with two threads each on two cores stall each other at every parallel region and
# took 7.5 minutes where one thread per worker takes 4.4 (two idle cores).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_name] = "1"
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    # the slow tests first: with a worker per core (`make test`) they then run beside the many short ones instead of
    # forming the run's tail (the order within each group is kept)
    items.sort(key=lambda item: "slow" not in item.keywords)
    has_gpu = torch.cuda.is_available()
    hopper = has_gpu and torch.cuda.get_device_capability()[0] == 9
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_hopper = pytest.mark.skip(reason="needs a Hopper (sm_90) GPU")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "hopper" in item.keywords and not hopper:
            item.add_marker(skip_hopper)


def nvcc_path():
    return shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc") or None


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    from .helpers import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("tiny-ckpt"), seed=1, max_pos=1024)


@pytest.fixture(scope="session")
def tiny_lm(tiny_ckpt):
    from sift_cli.models import load_model

    return load_model(str(tiny_ckpt), device="cpu")


@pytest.fixture(scope="session")
def smol_cpu():
    """The bundled SmolLM2-135M on the CPU, loaded once for every test of the real model (a few seconds each
    time); tests that swap its attention put it back."""
    from sift_cli.models import load_model

    return load_model(None, device="cpu")


@pytest.fixture
def small_corpus(tmp_path):
    """Twelve documents of mixed length (a few tokens to a few hundred) from real prose."""
    from .helpers import TRAINING_TEXT

    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(12):
        words = " ".join(TRAINING_TEXT[j % len(TRAINING_TEXT)] for j in range(i, i + 1 + (i * 5) % 11))
        (root / f"doc{i:02d}.txt").write_text(words)
    return root
