"""The report's building blocks and their two renderings: markdown and HTML (every piece of text escaped).

A section is a sequence of :class:`Block` (heading, paragraph, code, list, table) built by a pure function
from the read model; :func:`blocks_markdown` and :func:`blocks_html` render any section, so a section never
writes markdown or HTML by hand. :func:`md_table` is the one markdown table writer.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Block:
    """One piece of a section: ``kind`` is h2, h3, p, code, ul or table."""

    kind: str
    text: str = ""
    items: tuple[str, ...] = ()  # ul items, or a table's header
    rows: tuple[tuple[str, ...], ...] = ()


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> Block:
    return Block("table", items=tuple(header), rows=tuple(tuple(r) for r in rows))


def md_cell(text: str) -> str:
    """A markdown table cell: pipes escaped, line breaks folded."""
    return text.replace("|", "\\|").replace("\n", " ")


def md_pipes(text: str) -> str:
    """A markdown table cell with its pipes escaped, line breaks kept."""
    return text.replace("|", "\\|")


def md_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    rule: str = "---",
    header_cell: Callable[[str], str] = md_cell,
    row_cell: Callable[[str], str] = md_cell,
    empty: str | None = None,
) -> str:
    """A markdown table, one line per row, ending in a newline; ``rule`` is each header-separator cell;
    ``empty`` stands in for a table without rows (None: print the bare header)."""
    if not rows and empty is not None:
        return empty + "\n"
    lines = ["| " + " | ".join(header_cell(h) for h in header) + " |", "|" + "|".join(rule for _ in header) + "|"]
    lines += ["| " + " | ".join(row_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def plain_md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The report's data tables: header as given, pipes escaped in the cells, ``_no data_`` without rows."""
    return md_table(header, rows, header_cell=str, row_cell=md_pipes, empty="_no data_")


def blocks_markdown(blocks: Sequence[Block], rule: str = "---") -> str:
    lines: list[str] = []
    for b in blocks:
        if b.kind == "h2":
            lines += [f"## {b.text}", ""]
        elif b.kind == "h3":
            lines += [f"### {b.text}", ""]
        elif b.kind == "p":
            lines += [b.text, ""]
        elif b.kind == "code":
            lines += ["```sh", b.text, "```", ""]
        elif b.kind == "ul":
            lines += [f"- {i}" for i in b.items] + [""]
        else:
            lines += md_table(b.items, b.rows, rule).splitlines() + [""]
    return "\n".join(lines)


def blocks_html(blocks: Sequence[Block]) -> list[str]:
    """One HTML fragment per block, every piece of text escaped."""

    def e(x: object) -> str:
        return html.escape(str(x), quote=True)

    parts = []
    for b in blocks:
        if b.kind in ("h2", "h3", "p"):
            parts.append(f"<{b.kind}>{e(b.text)}</{b.kind}>")
        elif b.kind == "code":
            parts.append(f"<pre><code>{e(b.text)}</code></pre>")
        elif b.kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in b.items) + "</ul>")
        else:
            head = "".join(f"<th>{e(h)}</th>" for h in b.items)
            body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return parts


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The report's data tables in HTML, every cell escaped; a muted "No data." without rows."""
    if not rows:
        return "<p class='muted'>No data.</p>"
    (fragment,) = blocks_html([table(header, rows)])
    return fragment
