"""No import cycle among the modules of src (issue 47): every import counts, those under ``TYPE_CHECKING`` and those
inside functions included, since each says that one module needs the other. A cycle is reported as the modules it
joins, each with the line that imports the next."""

from __future__ import annotations

import grimp


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    group.append(x)
                    if x == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_a_cycle_is_found_on_a_constructed_graph() -> None:
    g = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.d", "p.e")):
        g.add_import(importer=a, imported=b)
    assert cycles(g) == [["p.a", "p.b", "p.c"]]


def test_no_import_cycle_among_the_modules_of_src() -> None:
    graph = grimp.build_graph("xover", exclude_type_checking_imports=False)
    found = cycles(graph)
    detail = []
    for group in found:
        for a in group:
            for b in group:
                if a != b and graph.direct_import_exists(importer=a, imported=b):
                    lines = graph.get_import_details(importer=a, imported=b)
                    detail.append(
                        f"{a} -> {b}: " + "; ".join(f"{d['line_number']}: {d['line_contents']}" for d in lines)
                    )
    assert not found, "\n".join(detail)


def test_function_local_imports_stand_only_where_they_buy_start_up_time() -> None:
    """Outside the CLI (whose modules `xover --help` imports, and which say so once at the top), an import inside a
    function hides what depends on what: each one left says why on its line (matplotlib's 0.5 s)."""
    import ast
    from pathlib import Path

    import xover

    src = Path(xover.__file__).parent
    unexplained = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        if rel.startswith("cli/"):
            if any(isinstance(n, (ast.Import, ast.ImportFrom)) and n.col_offset for n in ast.walk(ast.parse(text))):
                assert "stand inside the commands, for start-up time" in text, rel
            continue
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(fn):
                    if isinstance(n, (ast.Import, ast.ImportFrom)) and "# local:" not in lines[n.lineno - 1]:
                        unexplained.append(f"{rel}:{n.lineno}: {lines[n.lineno - 1].strip()}")
    assert unexplained == []
