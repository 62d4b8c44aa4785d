"""What a throughput search writes to its run store: write statements, rows changed and SQL bytes.

A throughput search (``python -m search.run --memory-cap ...``, gpt/small by default) runs in this process with
every SQLite connection it opens traced (``sqlite3.Connection.set_trace_callback``): each INSERT, UPDATE, DELETE
or REPLACE is counted with the length of its SQL as executed (bound values expanded), and each connection's
``total_changes`` (rows inserted, updated or deleted) is read as it closes. The store file's size is
read last. Written (``--out``) as JSON.

    python bench/studies/store_writes.py --out /tmp/store_writes.json
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
SEARCH = ["--workload", "gpt/small", "--memory-cap", "40", "55", "--timesteps", "256", "--no-progress"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="gpt/tiny at caps of 1.2 and 2.5 MiB instead (seconds)")
    args = ap.parse_args()
    search_args = (["--workload", "gpt/tiny", "--memory-cap", "1.2", "2.5", "--timesteps", "128", "--agents", "1",
                    "--max-measurements", "10", "--repeats", "1", "--no-progress", "--no-batch-scaling"]
                   if args.quick else SEARCH)
    statements: list[str] = []
    changes: list[int] = []  # each connection's total_changes, read as it closes
    connect = sqlite3.connect

    class Traced(sqlite3.Connection):
        def close(self) -> None:
            changes.append(self.total_changes)
            super().close()

    def traced(*a: object, **kw: object) -> sqlite3.Connection:
        conn = connect(*a, factory=Traced, **kw)  # type: ignore[arg-type,misc]
        conn.set_trace_callback(lambda sql: statements.append(sql) if sql.lstrip().upper().startswith(WRITES)
                                else None)
        return conn

    sqlite3.connect = traced  # type: ignore[assignment]
    from search.run import main as search

    with tempfile.TemporaryDirectory() as tmp:
        try:
            code = search([*search_args, "--out", tmp, "--name", "writes"])
        finally:
            sqlite3.connect = connect  # type: ignore[assignment]
        size = (Path(tmp) / "writes" / "store.sqlite").stat().st_size
    result = {"bench": "store_writes", "command": "python -m search.run " + " ".join(search_args), "exit_code": code,
              "write_statements": len(statements), "sql_bytes_written": sum(len(s) for s in statements),
              "rows_changed": sum(changes), "store_bytes": size,
              "by_table": _by_table(statements)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("by_table", "command")}))
    return 0 if code == 0 else 1


def _by_table(statements: list[str]) -> dict[str, dict[str, int]]:
    """Write statements and their SQL bytes per (verb, table)."""
    out: dict[str, dict[str, int]] = {}
    for sql in statements:
        words = sql.split()
        verb = words[0].upper()
        table = next((w for w, prev in zip(words[1:], words) if prev.upper() in ("INTO", "UPDATE", "FROM")), "?")
        table = table.split("(")[0].strip('"')
        row = out.setdefault(f"{verb} {table}", {"statements": 0, "bytes": 0})
        row["statements"] += 1
        row["bytes"] += len(sql)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
