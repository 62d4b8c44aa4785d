"""The skeleton of every benchmark script: its command line, quick or full settings, the result file.

A script is its measurement. It declares a ``Bench`` (its result's name, its docstring, its own
flags, what ``--quick`` sets) and a function that fills ``run.result``, and hands both to ``main``::

    BENCH = Bench("dynamic", __doc__, options=options, quick={"steps": 8, "rounds": 2})

    def measure(run: Run) -> None:
        run.result.update(...)            # or run.add_row(row) after each row of a long run

    if __name__ == "__main__":
        main(BENCH, measure)

``main`` parses the flags every script shares beside the script's own: ``--quick`` (tiny sizes,
what ``tests/test_bench_smoke.py`` runs), ``--out FILE``, ``--threads N`` where the bench times
steps in its own process, ``--append`` where a result keeps rows across runs. It records the
settings and the load average at the start, runs the measurement, writes
``bench/results/<name>.json`` with the machine (``bench.common.write_result``), then prints the
result as ``BENCHMARKS.md`` shows it (its view in ``bench.views``) and the file's path. A bad
input or a failed step ends the script with one line naming it (``CkptSearchError``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from bench import views
from bench.common import RESULTS_DIR, Result, read_result, set_threads, write_result
from env.data.errors import CkptSearchError


@dataclass(frozen=True)
class Bench:
    """What a benchmark script declares; ``main`` does the rest."""

    name: str  # its result: bench/results/<name>.json, rendered by views.VIEWS[name]
    doc: str  # the script's docstring: what it measures and how; --help prints it
    options: Callable[[argparse.ArgumentParser], None] | None = None  # the script's own flags
    quick: Mapping[str, Any] = field(default_factory=dict)  # flag destination -> value under --quick
    threads: int | None = None  # default of --threads (torch threads while timing); None: no such flag
    rows: str | None = None  # the result's list of rows; with row_id, --append keeps the file's other rows
    row_id: Callable[[Result], Any] | None = None  # what names a row (a row measured again replaces it)
    name_of: Callable[[argparse.Namespace], str] | None = None  # a result name that depends on the flags

    def parser(self) -> argparse.ArgumentParser:
        ap = argparse.ArgumentParser(description=self.doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        if self.options:
            self.options(ap)
        quick = ", ".join(f"--{k.replace('_', '-')} {_shown(v)}" for k, v in self.quick.items())
        ap.add_argument("--quick", action="store_true",
                        help="tiny sizes, seconds: the smoke test" + (f" ({quick})" if quick else ""))
        ap.add_argument("--out", type=Path, help=f"result file (default bench/results/{self.name}.json)")
        if self.threads is not None:
            ap.add_argument("--threads", type=int, default=self.threads,
                            help="torch threads while measuring; 1 keeps step times steady on a shared machine")
        if self.rows and self.row_id:
            ap.add_argument("--append", action="store_true",
                            help=f"keep the {self.rows} of the result file that this run does not measure again "
                                 "(each keeps the machine and date it was measured on)")
        return ap


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def settings(args: argparse.Namespace) -> Result:
    """The flags a result was measured with, as JSON values."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}


class Run:
    """One invocation of a benchmark: its flags, the result being built and the file it goes to."""

    def __init__(self, bench: Bench, args: argparse.Namespace) -> None:
        self.bench, self.args = bench, args
        self.name = bench.name_of(args) if bench.name_of else bench.name
        self.path: Path = args.out or RESULTS_DIR / f"{self.name}.json"
        self.device = "cpu"  # the device the result's machine line names
        self.result: Result = {"settings": settings(args), "load_average_at_start": list(os.getloadavg())}
        self._kept: set[int] = set()  # ids of the rows kept from the file (--append), not measured yet
        self._replaced: Result | None = None
        if bench.rows:
            self.result[bench.rows] = []
            if getattr(args, "append", False) and self.path.is_file():
                self._keep_rows(read_result(self.path))

    def _keep_rows(self, earlier: Result) -> None:
        key = self.bench.rows
        stamp = {"machine": earlier.get("machine"), "written_at": earlier.get("written_at")}
        rows = [r if "machine" in r else {**r, **stamp} for r in earlier.get(key, [])]
        self.result[key] = rows
        self._kept = {id(r) for r in rows}
        self.result["earlier_runs"] = earlier.get("earlier_runs", [])
        self._replaced = {**stamp, key: []}

    def add_row(self, row: Result) -> Path:
        """A measured row joins the result, in place of a kept row of the same id (that one goes to
        ``earlier_runs`` with the date and machine it was measured on); the file is written."""
        rows: list[Result] = self.result[self.bench.rows]
        same = [i for i, r in enumerate(rows) if id(r) in self._kept and self._same(r, row)]
        if same and self._replaced is not None:
            old = rows[same[0]]
            self._replaced[self.bench.rows].append(old)
            if len(self._replaced[self.bench.rows]) == 1:
                self.result["earlier_runs"].append(self._replaced)
            self._kept.discard(id(old))
            rows[same[0]] = row
        else:
            rows.append(row)
        return self.save()

    def _same(self, a: Result, b: Result) -> bool:
        return self.bench.row_id is not None and self.bench.row_id(a) == self.bench.row_id(b)

    def save(self) -> Path:
        """The result as it stands, with this machine and the time (a long run keeps what it did)."""
        return write_result(self.name, self.result, self.path, device=self.device)


Measure = Callable[[Run], None]


def parse(bench: Bench, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The script's flags, with ``--quick``'s settings applied."""
    args = bench.parser().parse_args(argv)
    if args.quick:
        for key, value in bench.quick.items():
            setattr(args, key, value)
    return args


def execute(bench: Bench, measure: Measure, args: argparse.Namespace) -> Path:
    """Measure, write the result, print its markdown and its path; one line on a bad input."""
    run = Run(bench, args)
    try:
        if bench.threads is not None:
            set_threads(args.threads)
        measure(run)
    except CkptSearchError as e:
        raise SystemExit(f"bench/{bench.name}.py: {e}") from None
    path = run.save()
    print(views.markdown(run.name, read_result(path)))  # as written: what BENCHMARKS.md will show
    print(path)
    return path


def main(bench: Bench, measure: Measure, argv: Sequence[str] | None = None) -> Path:
    """``python bench/<name>.py [flags]``: parse, measure, write, print."""
    return execute(bench, measure, parse(bench, argv))
