"""The fault matrix (cases.py): real child processes, real SIGKILL at named stages, real concurrency, a real
file-size limit; after each, the set is checked as `harness.check_set` says. One uninterrupted reference per set
kind, made once; re-runs happen in this process (no kill needed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sift_cli.config_file import read_config
from sift_cli.shards.format import MANIFEST, part_name, shard_of
from sift_cli.shards.reader import ShardSet

from ..helpers import TRAINING_TEXT
from . import harness, operations as op
from .cases import KILL_CASES, PAIRS, RESOURCES
from .harness import DONE, KILLED, REFUSED

SHARDS = op.SHARDS
NEW_CONFIG = ({"tile": 16, "alpha": 0.001, "beta": 0.01, "gamma": 0.1}, {"target": "kl <= 0.001"})


class World:
    """The corpus, the reference sets and the writers' jobs, each a function of a directory."""

    def __init__(self, root: Path, ckpt: Path):
        self.root, self.ckpt = root, str(ckpt)
        os.environ[op.CKPT_ENV] = self.ckpt  # read by the fork server, started by the first child
        self.corpus = root / "corpus"
        self.corpus.mkdir()
        for i, text in enumerate(TRAINING_TEXT):
            (self.corpus / f"doc{i}.txt").write_text(text)
        self.ref = root / "ref"
        op.profile(self.ckpt, str(self.corpus), str(self.ref))
        self.prefix = ShardSet(self.ref).prefix_token_ids
        ids = [f"added-{i}" for i in range(20)]
        second = next(i for i in ids if shard_of(i, SHARDS) != shard_of(ids[0], SHARDS))
        self.extra = [(ids[0], "A document no corpus has, added with a prompt.", "t"),
                      (second, "Another one, added by a second prompt at the same time.", "t")]
        self.ref_added = self._copy(self.ref, "ref-added")
        op.add(self.ckpt, str(self.ref_added), self.extra[0], self.prefix)
        self.ref_both = self._copy(self.ref_added, "ref-both")
        op.add(self.ckpt, str(self.ref_both), self.extra[1], self.prefix)
        self.rows = {k: harness.set_rows(d) for k, d in
                     (("ref", self.ref), ("added", self.ref_added), ("both", self.ref_both))}
        self.n = 0

    def _copy(self, src: Path, name: str) -> Path:
        shutil.copytree(src, self.root / name)
        return self.root / name

    def fresh(self, like: Path | None = None) -> Path:
        self.n += 1
        d = self.root / f"case{self.n}"
        if like is not None:
            shutil.copytree(like, d)
        else:
            d.mkdir()
        return d

    def profile(self, d):
        return ("profile", self.ckpt, str(self.corpus), str(d))

    def add(self, d, which=0):
        return ("add", self.ckpt, str(d), self.extra[which], self.prefix)


def do(job: tuple):
    """Run a job here, in this process."""
    return getattr(op, job[0])(*job[1:])


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_ckpt):
    return World(tmp_path_factory.mktemp("faults"), tiny_ckpt)


def _set_writer(world: World, writer: str):
    """(directory, the writer's job, the rows a finished set must hold) of a set-writing case."""
    if writer == "profile":
        d = world.fresh()
        return d, world.profile(d), world.rows["ref"]
    if writer == "additions":
        d = world.fresh(world.ref)
        return d, world.add(d), world.rows["added"]
    d = world.fresh(world.ref)
    shutil.rmtree(d / "store")  # both build it from the part files
    if writer == "finalize":
        (d / MANIFEST).unlink()
        return d, ("finalize", str(d)), world.rows["ref"]
    return d, ("index", str(d)), world.rows["ref"]


@pytest.mark.parametrize("writer,stage", KILL_CASES, ids=[f"{w}-{s}" for w, s in KILL_CASES])
def test_killed_writer(world, writer, stage):
    if writer == "calibrate":
        d = world.fresh()
        path = d / "sift.toml"
        op.calibrate(str(path), {"tile": 32, "alpha": 0.5, "beta": 0.5, "gamma": 0.5}, {"target": "old"})
        assert harness.run(("calibrate", str(path), *NEW_CONFIG), kill_at=stage) == KILLED
        assert read_config(path)["calibration"]["target"] in ("old", "kl <= 0.001")  # one whole file or the other
        op.calibrate(str(path), *NEW_CONFIG)
        assert read_config(path)["profile"]["tile"] == 16 and harness.leftovers(d) == []
        return
    if writer == "gguf":
        d, sha = world.fresh(), "ab" * 32
        assert harness.run(("convert", str(d), sha), kill_at=stage) == KILLED
        target = harness.run(("convert", str(d), sha)) == DONE and d / "gguf" / sha[:24]
        assert (target / "model.safetensors").read_bytes() == b"weights"
        assert harness.leftovers(d / "gguf") == []
        return
    d, job, expected = _set_writer(world, writer)
    assert harness.run(job, kill_at=stage) == KILLED, f"{writer} never reached {stage}"
    harness.damage_named(d)
    do(job)  # the re-run, as the advice says: the same command again
    harness.check_set(d, expected)


@pytest.mark.parametrize("pair", PAIRS)
def test_concurrent_writers(world, pair):
    if pair == "reader + adder":
        d = world.fresh(world.ref)
        expected = {r["doc_id"]: (r["la_bits"], r["ca_bits"]) for rows, _ in world.rows["ref"].values()
                    for r in rows}
        reader = harness.start(("read", str(d), expected))
        assert harness.run(world.add(d)) == DONE
        assert reader.is_alive(), "the reader failed while the adder wrote"
        reader.kill()
        assert harness.outcome(reader) == KILLED
        harness.check_set(d, world.rows["added"])
        return
    if pair == "two profilers":
        d = world.fresh()
        jobs, expected = [world.profile(d), world.profile(d)], world.rows["ref"]
    elif pair == "profiler + adder":
        d = world.fresh(world.ref)
        (d / part_name(shard_of(world.extra[0][0], SHARDS))).unlink()  # a bucket left to profile, the adder's
        (d / MANIFEST).unlink()
        jobs, expected = [world.profile(d), world.add(d)], world.rows["added"]
    elif pair == "adder + finalize":
        d = world.fresh(world.ref)
        (d / MANIFEST).unlink()
        jobs, expected = [world.add(d), ("finalize", str(d))], world.rows["added"]
    else:
        d = world.fresh(world.ref)
        jobs, expected = [world.add(d, 0), world.add(d, 1)], world.rows["both"]
    children = [harness.start(job) for job in jobs]
    assert [harness.outcome(c) for c in children] == [DONE, DONE]
    harness.check_set(d, expected)


@pytest.mark.parametrize("writer,fault", RESOURCES, ids=[w for w, _ in RESOURCES])
def test_full_disk(world, writer, fault):
    if writer == "calibrate":
        d = world.fresh()
        path = d / "sift.toml"
        big = (NEW_CONFIG[0], {"target": "x" * 4000})
        assert harness.run(("calibrate", str(path), *big), file_size=1000) == REFUSED
        assert not path.exists() and harness.leftovers(d) == []
        op.calibrate(str(path), *big)
        assert read_config(path)["calibration"]["target"] == "x" * 4000
        return
    d, job, expected = _set_writer(world, writer)
    assert harness.run(job, file_size=2000) == REFUSED
    harness.damage_named(d)
    assert harness.leftovers(d) == []  # a failed write removes its temporary
    do(job)
    harness.check_set(d, expected)


def test_docs_carry_the_matrix():
    from .cases import matrix_table

    doc = (Path(__file__).parents[2] / "docs" / "concurrency.md").read_text()
    assert matrix_table() in doc, "docs/concurrency.md: paste tests.faults.cases.matrix_table() again"
