"""Mutation score of a kit module against the tests that guard it (mutmut), printed and kept in benchmarks/results.

    python3 -m pip install mutmut
    python benchmarks/mutation.py [--max-children 2] kit/plan.py -- tests/test_plan.py [-k EXPR]

mutmut changes one thing at a time in the module (an operator, a constant, a comparison, a returned value) and runs
the tests that cover it; a mutant the tests do not notice "survived". The run happens in a temporary copy of the
repository with its own [tool.mutmut] section, so nothing here changes. Not a test: minutes to hours per module.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPY = ("kit", "tests", "images", "templates", "appstore", "pyproject.toml", ".hadolint.yaml")


def run(module: str, tests: list[str], max_children: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="kit-mutation-") as tmp:
        work = Path(tmp) / "repo"
        work.mkdir()
        for name in COPY:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, work / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.is_file():
                shutil.copy2(source, work / name)
        pyproject = work / "pyproject.toml"
        pyproject.write_text(pyproject.read_text() + "\n[tool.mutmut]\n"
                             f'source_paths = ["kit/"]\nonly_mutate = ["{module}"]\n'
                             f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
                             'also_copy = ["images/", "templates/", "appstore/", ".hadolint.yaml"]\n')
        start = time.monotonic()
        # the copy's kit/ must be the one imported: a PYTHONPATH to the checkout would test the unmutated code
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        ran = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)], cwd=work,
                             capture_output=True, text=True, env=env)
        if ran.returncode != 0 and "No module named mutmut" in ran.stderr:
            raise SystemExit("mutmut is not installed: python3 -m pip install mutmut")
        listing = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work,
                                 capture_output=True, text=True, env=env).stdout
        counts: dict[str, int] = {}
        survivors = {}
        for line in listing.splitlines():
            match = re.match(r"\s*(\S+): (\w[\w ]*)$", line)
            if match:
                counts[match.group(2)] = counts.get(match.group(2), 0) + 1
                if match.group(2) == "survived":  # the change itself, for a reader to judge or kill
                    diff = subprocess.run([sys.executable, "-m", "mutmut", "show", match.group(1)], cwd=work,
                                          capture_output=True, text=True, env=env).stdout
                    survivors[match.group(1)] = [l for l in diff.splitlines() if l[:1] in "+-"
                                                 and not l.startswith(("+++", "---"))]
    killed = counts.get("killed", 0)
    judged = killed + counts.get("survived", 0)
    return {"module": module, "tests": tests, "counts": counts, "score": round(killed / judged, 3) if judged else None,
            "survivors": survivors, "wall_s": round(time.monotonic() - start),
            "output_tail": (ran.stdout + ran.stderr)[-1500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module")
    parser.add_argument("tests", nargs="+")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mutation.json")
    args = parser.parse_args()
    result = run(args.module, args.tests, args.max_children)
    if result["score"] is None:  # nothing was judged: keep the last real score rather than a blank one
        raise SystemExit(f"{result['module']}: mutmut judged no mutant ({result['counts']}); nothing kept\n"
                         f"{result['output_tail']}")
    print(f"{result['module']}: score {result['score']} ({result['counts']}) in {result['wall_s']} s")
    for name, change in result["survivors"].items():
        print(f"  survived: {name}: {' | '.join(change)[:200]}")
    kept = json.loads(args.out.read_text()) if args.out.is_file() else {}
    kept[result["module"]] = {k: v for k, v in result.items() if k != "output_tail"}
    args.out.write_text(json.dumps(kept, indent=1) + "\n")


if __name__ == "__main__":
    main()
