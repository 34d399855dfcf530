"""Benchmarks: each writes its figures under reports/ (python -m pipeline.bench.NAME)."""


def write_history(rows: list, out: str, table, plot, nothing: str) -> None:
    """A history benchmark's outputs: `<out>.md` (table(rows)) and `<out>.png` (plot(rows, path));
    no rows: `error: <nothing>` on one line and exit 2."""
    import sys
    from pathlib import Path

    if not rows:
        print(f"error: {nothing}", file=sys.stderr)
        raise SystemExit(2)
    Path(f"{out}.md").write_text(table(rows))
    plot(rows, f"{out}.png")
    print(f"{len(rows)} runs -> {out}.md, {out}.png")
