"""What a Python `engine.call` costs: ~200-byte argument dicts (and the same as JSON text), the
default policy, a warm session, release build.

Run: `python bindings/python/bench.py` (after `pip install ./bindings/python`).
"""

from __future__ import annotations

import json
import statistics
import time

import loopguard


def calls(n: int = 64):
    tools = ["read_file", "bash", "grep", "str_replace_editor", "web_search", "list_directory"]
    return [
        (
            tools[i % len(tools)],
            {
                "path": f"src/module_{i:03}/handlers/request_validation.rs",
                "command": f"cargo test -p service_{i} -- --nocapture validation::",
                "pattern": f"fn validate_{i}\\\\(",
                "offset": i * 40,
                "limit": 200,
                "request_id": f"req-{i:08x}",
            },
        )
        for i in range(n)
    ]


def measure(engine, args, rounds: int = 21, per_round: int = 10_000) -> tuple[float, float]:
    """The mean time of one call in each round, in microseconds: the fastest round (the least
    disturbed by the rest of the machine) and the median round."""
    ids = [f"call_{i}" for i in range(len(args))]
    for i in range(4 * len(args)):  # warm the session: steady state
        k = i % len(args)
        engine.call("bench", ids[k], args[k][0], args[k][1])
    medians = []
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(per_round):
            k = i % len(args)
            engine.call("bench", ids[k], args[k][0], args[k][1])
        medians.append((time.perf_counter() - start) / per_round * 1e6)
    return min(medians), statistics.median(medians)


def main() -> None:
    args = calls()
    size = statistics.mean(len(json.dumps(a)) for _, a in args)
    as_dict = measure(loopguard.Engine(), args)
    as_text = measure(loopguard.Engine(), [(t, json.dumps(a)) for t, a in args])
    for name, (best, median) in [
        (f"~{size:.0f}-byte arguments as a dict", as_dict),
        ("the same arguments as JSON text", as_text),
    ]:
        print(f"engine.call, {name}: {best:.2f} µs (fastest round), {median:.2f} µs (median round)")


if __name__ == "__main__":
    main()
