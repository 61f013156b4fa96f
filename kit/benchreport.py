"""kit bench's report: the runs as JSON, as the seeds' speed table, and as a bar chart."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kit.bench import Run, scenarios
from kit.benchclient import Sample


def to_json(runs: list[Run]) -> str:
    def sample_dict(s: Sample) -> dict[str, Any]:
        d = asdict(s)
        d.update(tpot=s.tpot, decode_tps=s.decode_tps)
        return d

    return json.dumps([{"url": r.url, "model": r.model, "interrupted": r.interrupted,
                        "results": [asdict(x) for x in r.results],
                        "samples": [sample_dict(s) for s in r.samples]} for r in runs], indent=2)


def table_rows(runs: list[Run]) -> list[list[str]]:
    """The seeds' layout: short / medium / long (single-stream decode tok/s), then 'N concurrent total'."""
    rows: list[list[str]] = []
    names = [n for n in scenarios()["scenarios"] if any(r.scenario == n for run in runs for r in run.results)]
    for name in names:
        row = [name]
        for run in runs:
            single = next((r for r in run.results if r.scenario == name and r.concurrency == 1), None)
            row.append(f"{single.decode_tps['median']:.1f} t/s" if single and single.decode_tps else "-")
        rows.append(row)
    levels = sorted({r.concurrency for run in runs for r in run.results if r.concurrency > 1})
    for c in levels:
        row = [f"{c} concurrent total"]
        for run in runs:
            hits = [r.output_tps for r in run.results if r.concurrency == c]
            row.append(f"{min(hits):.0f}-{max(hits):.0f} t/s" if len(hits) > 1 else
                       (f"{hits[0]:.0f} t/s" if hits else "-"))
        rows.append(row)
    return rows


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = sorted({(r.scenario, r.concurrency) for run in runs for r in run.results},
                    key=lambda k: (list(scenarios()["scenarios"]).index(k[0]), k[1]))
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        values = []
        for scenario, c in labels:
            hit = next((r for r in run.results if r.scenario == scenario and r.concurrency == c), None)
            values.append(hit.output_tps if hit else 0)
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=run.url)
    ax.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels([f"{s}\nx{c}" for s, c in labels])
    ax.set_ylabel("output tok/s (total)")
    ax.set_title("kit bench")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
