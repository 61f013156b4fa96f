"""kit bench's statistics: the samples of one scenario at one concurrency summarized as vLLM's ``bench serve`` names
them (TTFT, TPOT, ITL, E2EL percentiles; output tok/s and requests/s over the wall time)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from kit.benchclient import Sample


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pct(p: float) -> float:
        k = (len(ordered) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

    return {"mean": statistics.fmean(ordered), "median": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
            "std": statistics.pstdev(ordered)}


@dataclass
class Result:
    scenario: str
    concurrency: int
    requests: int
    failures: int
    wall_s: float
    ttft: dict[str, float]
    tpot: dict[str, float]
    itl: dict[str, float]
    e2el: dict[str, float]
    decode_tps: dict[str, float]
    output_tps: float
    req_per_s: float
    tokens_from: str
    errors: list[str]
    server_decode_tps: float | None = None
    prompt_processed: float | None = None  # median prompt tokens the server processed (timings.prompt_n, else usage)


def summarize(samples: list[Sample], wall_s: float) -> Result:
    ok = [s for s in samples if s.ok]
    sources = {s.tokens_from for s in ok}
    server = [s.server_timings.get("predicted_per_second") for s in ok
              if s.server_timings and s.server_timings.get("predicted_per_second")]
    processed = [(s.server_timings or {}).get("prompt_n", s.prompt_tokens) for s in ok
                 if s.server_timings or s.prompt_tokens]
    return Result(
        scenario=samples[0].scenario, concurrency=samples[0].concurrency, requests=len(samples),
        failures=len(samples) - len(ok), wall_s=wall_s,
        ttft=percentiles([s.ttft for s in ok]), tpot=percentiles([s.tpot for s in ok if s.tpot is not None]),
        itl=percentiles([gap for s in ok for gap in s.itl]), e2el=percentiles([s.e2el for s in ok]),
        decode_tps=percentiles([s.decode_tps for s in ok if s.decode_tps]),
        output_tps=sum(s.output_tokens for s in ok) / wall_s if wall_s else 0.0,
        req_per_s=len(ok) / wall_s if wall_s else 0.0,
        tokens_from="usage" if sources == {"usage"} else ("chunks" if sources == {"chunks"} else "mixed"),
        errors=sorted({s.error for s in samples if not s.ok})[:5],
        server_decode_tps=statistics.fmean(server) if server else None,
        prompt_processed=statistics.median(processed) if processed else None,
    )
