"""CPU-side checks of the bundled CUDA kernels: every .cu compiles for sm_90a with nvcc (skipped without nvcc),
with no register spills and no serialised wgmma; host-side helpers behave without a GPU."""

import fcntl
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sift_cli.cuda import attention as cuda_attention
from sift_cli.cuda import plan as cuda_plan
from sift_cli.cuda import runtime
from sift_cli.errors import SiftError
from tests.conftest import nvcc_path

# one worker compiles every variant once (the module's `builds` fixture), early: `make test` runs with
# --dist loadgroup, which keeps a group on one worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("nvcc")]

# (head_dim, table KV block, paired, query block rows, pingpong): every configuration a table can run; 128-row
# query blocks with pingpong on (the default) and off
ATTN_CONFIGS = [(d, bn, pair, bm, pp) for d in (64, 128) for bn, pair in ((64, False), (64, True), (128, False))
                for bm in (128, 64) for pp in ((1, 0) if bm == 128 else (0,))]


# the attention-feature variants a windowed or soft-capped layer launches (docs/kernels.md), at the two register
# budgets (128 rows: pingpong, 168 registers at entry; 64 rows: 128)
FEATURE_DEFINES = [[("WINDOW", 128)], [("SOFTCAP", 1), ("SOFTCAP_VALUE", "30.0")],
                   [("SOFTCAP", 1), ("SOFTCAP_VALUE", "2.5"), ("WINDOW", 4096)]]
FEATURE_CONFIGS = [(128, 64, True, 128, 1), (64, 64, True, 64, 0)]

DIAGNOSTIC_DEFINES = [[("TRACE", 1)], [("TRACE", 2), ("TRACE_WAITS", 0x0F)], [("TRACE", 2), ("TRACE_WAITS", 0x10)],
                      [("ABLATE_SAME_KV", 1)]]


def _attention_defines(head_dim, block_n, pair, block_m, pingpong):
    cfg = cuda_attention.kernel_config(head_dim, block_n, pair, block_m=block_m)
    return [("HEAD_DIM", head_dim), ("BLOCK_N", cfg.block_n), ("STAGES", cfg.stages), ("PAIR", int(pair)),
            ("BLOCK_M", block_m), ("PINGPONG", pingpong)]


def _build_list():
    builds = [("sparse_attn_fwd.cu", tuple(_attention_defines(*c))) for c in ATTN_CONFIGS]
    builds += [("sparse_attn_fwd.cu", (("HEAD_DIM", 128), ("BLOCK_N", 128), ("STAGES", 2), ("PAIR", 1),
                                        ("BLOCK_M", 128), *d)) for d in DIAGNOSTIC_DEFINES]
    builds += [("sparse_attn_fwd.cu", tuple(_attention_defines(*c) + d)) for c in FEATURE_CONFIGS
               for d in FEATURE_DEFINES]
    return builds + [("decode.cu", ()), ("coalesce.cu", ())]


def _compile(nvcc, folder, source, defines):
    cubin = folder / "k.cubin"
    cmd = [nvcc, "-gencode=arch=compute_90a,code=sm_90a", "--cubin", "-std=c++17", "-Xptxas", "-v",
           *[f"-D{k}={v}" for k, v in defines], "-o", str(cubin), str(runtime.kernel_dir() / source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stderr, cubin.stat().st_size if cubin.is_file() else 0


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """Every build these tests check, compiled once per test run and side by side (one nvcc per core: each takes
    seconds). Under pytest-xdist the workers share one folder and a lock: whichever worker gets here first compiles,
    any other reads its results (the xdist group alone did not keep the module on one worker in a full run)."""
    nvcc = nvcc_path()
    if not nvcc:
        pytest.skip("nvcc not found")
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "nvcc-builds"
    shared.mkdir(exist_ok=True)
    todo = _build_list()
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = shared / "builds.json"
        if record.is_file():
            return dict(zip(todo, (tuple(r) for r in json.loads(record.read_text()))))
        folders = [shared / f"b{i}" for i in range(len(todo))]
        for f in folders:
            f.mkdir()
        with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
            done = list(pool.map(lambda job: _compile(nvcc, job[1], *job[0]), zip(todo, folders)))
        record.write_text(json.dumps(done))
        return dict(zip(todo, done))


def _report(builds, source, defines):
    code, stderr, size = builds[(source, tuple(defines))]
    assert code == 0, stderr
    assert size > 0
    return stderr


@pytest.mark.parametrize("head_dim,block_n,pair,block_m,pingpong", ATTN_CONFIGS)
def test_attention_kernel_compiles(builds, head_dim, block_n, pair, block_m, pingpong):
    report = _report(builds, "sparse_attn_fwd.cu", _attention_defines(head_dim, block_n, pair, block_m, pingpong))
    # ptxas serialising the wgmma pipeline (a divergent path, or registers written mid-pipeline) is a regression
    assert "C7520" not in report and "C7513" not in report, "serialised wgmma:\n" + report
    assert "C7508" not in report, "ptxas ignored setmaxnreg:\n" + report
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(s == ("0", "0") for s in spills), report
    assert "0 bytes stack frame" in report, report


@pytest.mark.parametrize("defines", DIAGNOSTIC_DEFINES)
def test_diagnostic_builds_compile(builds, defines):
    """The builds experiments/kernel_tile_trace.py times (per-tile stamps, wait sums, one K/V block) still compile
    with the wgmma pipeline intact; their clock reads may spill a few registers, which perturbs them a little."""
    report = _report(builds, "sparse_attn_fwd.cu", [("HEAD_DIM", 128), ("BLOCK_N", 128), ("STAGES", 2), ("PAIR", 1),
                                                    ("BLOCK_M", 128), *defines])
    assert "C7520" not in report and "C7513" not in report, "serialised wgmma:\n" + report


@pytest.mark.parametrize("config", FEATURE_CONFIGS)
@pytest.mark.parametrize("defines", FEATURE_DEFINES)
def test_feature_variants_compile(builds, config, defines):
    """The window and soft-cap variants compile with the wgmma pipeline intact (at 128 rows the window's masks may
    spill a few bytes: docs/kernels.md)."""
    report = _report(builds, "sparse_attn_fwd.cu", _attention_defines(*config) + defines)
    assert "C7520" not in report and "C7513" not in report, "serialised wgmma:\n" + report
    assert "C7508" not in report, "ptxas ignored setmaxnreg:\n" + report


def test_feature_variant_needs_its_value(tmp_path):
    nvcc = nvcc_path()
    if not nvcc:
        pytest.skip("nvcc not found")
    code, stderr, _ = _compile(nvcc, tmp_path, "sparse_attn_fwd.cu", [("SOFTCAP", 1)])
    assert code != 0 and "SOFTCAP needs SOFTCAP_VALUE" in stderr


def test_decode_kernel_compiles(builds):
    report = _report(builds, "decode.cu", [])
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(spills) == 3 and all(s == ("0", "0") for s in spills), report


def test_coalesce_kernel_compiles(builds):
    report = _report(builds, "coalesce.cu", [])
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    stacks = re.findall(r"(\d+) bytes stack frame", report)
    assert len(spills) == 2 and all(s == ("0", "0") for s in spills) and set(stacks) == {"0"}, report


def test_shared_memory_fits_hopper():
    """Every configuration fits with the lists of a 128K-token prompt staged (one entry per KV block, three slots),
    and 64-row query blocks over the default 64-key table leave room for two CTAs per SM up to 64K tokens."""
    for d in (64, 128):
        for bn, pair in ((64, False), (64, True), (128, False)):
            for bm in (128, 64):
                cfg = cuda_attention.kernel_config(d, bn, pair, block_m=bm)
                assert cuda_attention.attention_smem_bytes(cfg, 131072 // bn + 256) <= 227 * 1024, cfg
        cfg = cuda_attention.kernel_config(d, 64, block_m=64)
        smem = cuda_attention.attention_smem_bytes(cfg, 65536 // 64 + 256)
        assert 2 * (smem + 1024) <= cuda_attention.SM_SMEM, (cfg, smem)
    # a 200K-token prompt: a paired 128-row table at D 128 falls back to two tile slots (attention_function)
    cfg = cuda_attention.kernel_config(128, 64)
    assert cuda_attention.attention_smem_bytes(cfg, 204800 // 64 + 256) > cuda_attention.MAX_SMEM
    assert cuda_attention.attention_smem_bytes(cfg, 204800 // 64 + 256, tile_slots=2) <= cuda_attention.MAX_SMEM


def test_default_pairing():
    """64-key tables pair their blocks, except 64-row query blocks at head_dim 128 (two CTAs need the small ring)."""
    assert cuda_attention.kernel_config(128, 64).pair and cuda_attention.kernel_config(64, 64, block_m=64).pair
    cfg = cuda_attention.kernel_config(128, 64, block_m=64)
    assert (cfg.pair, cfg.block_n, cfg.stages, cfg.threads) == (False, 64, 2, 256)
    assert cuda_attention.kernel_config(128, 128).threads == 384
    with pytest.raises(SiftError, match="query blocks"):
        cuda_attention.kernel_config(128, 64, block_m=32)


def test_sources_found_and_self_contained():
    """What NVRTC compiles is one string: the shared header (split_row.cuh) inlined once, no include left, no CUDA
    headers needed."""
    for name in ("sparse_attn_fwd.cu", "decode.cu"):
        src = runtime.kernel_source(name)
        assert not re.search(r"^\s*#\s*(include|pragma once)", src, re.M)
        assert src.count("void split_row(") == 1


def test_cpu_tensors_are_refused_clearly():
    from sift_cli.attention.cuda import CudaBackend
    from sift_cli.block_lists import dense_block_lists
    from sift_cli.block_table import BlockTable

    q = torch.zeros(2, 10, 64, dtype=torch.bfloat16)
    with pytest.raises(SiftError, match="CUDA device"):
        CudaBackend().forward(q, q[:1], q[:1], dense_block_lists(BlockTable.causal(10), 2), 0.125)
    with pytest.raises(SiftError, match="head_dim"):
        cuda_attention.kernel_config(96, 64)


def test_vector_aligned_outputs():
    """The kernel stores 8 columns at once: views it can write directly, and those written through a buffer."""
    L, H, D = 5, 3, 64
    assert cuda_plan.vector_aligned(torch.empty(L, H, D, dtype=torch.bfloat16).transpose(0, 1))
    assert cuda_plan.vector_aligned(torch.empty(H, L, D, dtype=torch.bfloat16))
    assert not cuda_plan.vector_aligned(torch.empty(L, H, D + 1, dtype=torch.bfloat16)[..., 1:].transpose(0, 1))
    assert not cuda_plan.vector_aligned(torch.empty(H, L, 2 * D, dtype=torch.bfloat16)[..., ::2])
