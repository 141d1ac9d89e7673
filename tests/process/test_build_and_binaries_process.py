"""The tests of tests/unit/test_build_and_binaries.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from xover.llamacpp import build


def test_unpacked_tree_with_stamp(tmp_path):
    tree = tmp_path / "llama.cpp"
    (tree / "tools" / "server").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("")
    (tree / "XOVER_COMMIT").write_text(build.PINNED.commit + "\n")
    src = build.resolve_source(tree, tmp_path, print)
    assert src.commit == build.PINNED.commit and src.build_number == build.PINNED.build_number
