"""`sift bench profile` works in a folder of its own and removes it: never what it did not create."""

from sift_cli.lab.bench import profile as bench


def test_bench_profile_removes_only_its_own_folder(tmp_path, monkeypatch):
    mine = tmp_path / "nq-triton"  # named like a case's output: the user's, kept
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    seen = []

    def cases(*args):
        work = args[9]
        (work / "nq-triton").mkdir()
        seen.append(work)
        return [{"case": "nq"}]

    monkeypatch.setattr(bench, "_run_cases", cases)
    assert bench.run_profile_bench(cases=("8b-2k",), device="cpu", work_dir=tmp_path) == [{"case": "nq"}]
    assert seen[0].parent == tmp_path and not seen[0].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nq-triton"] and (mine / "keep.txt").is_file()
