"""How often the canary's judgement rolls back a candidate that is exactly as good as production.

Both sides draw latencies from the same distribution (lognormal, as request latencies are:
median 50 ms, a long right tail) and errors at the same rate; the candidate answers its share
of the step's requests, production the rest. Each trial is one step judged once at the end of
its hold, as gate/canary.py judges it (deploy/canary.py's judge and CanaryPolicy). Prints the
false-rollback rate per share and request count, with a 95% interval.

    .venv/bin/python scripts/canary_false_rollbacks.py [--trials 2000]
"""

from __future__ import annotations

import argparse
import json
import math
import random

from aieng_core.deploy.canary import CanaryPolicy, WindowFigures, judge, percentile


def side(rng: random.Random, requests: int, error_rate: float, sigma: float) -> WindowFigures:
    latencies, errors = [], 0
    for _ in range(requests):
        if rng.random() < error_rate:
            errors += 1
        else:
            latencies.append(50.0 * math.exp(rng.gauss(0.0, sigma)))
    return WindowFigures(requests, errors, percentile(latencies, 99) if latencies else None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    policy = CanaryPolicy()
    rows = []
    for share in (0.05, 0.25):
        for total in (2_000, 10_000):
            for sigma, error_rate in ((0.5, 0.001), (1.0, 0.005)):
                candidate_n = int(total * share)
                rollbacks = sum(
                    judge(side(rng, candidate_n, error_rate, sigma), side(rng, total - candidate_n, error_rate, sigma),
                          policy) is not None
                    for _ in range(args.trials)
                )  # fmt: skip
                rate = rollbacks / args.trials
                half = 1.96 * math.sqrt(max(rate * (1 - rate), 1 / args.trials) / args.trials)
                rows.append({"share": share, "step_requests": total, "candidate_requests": candidate_n,
                             "latency_sigma": sigma, "error_rate": error_rate, "false_rollback_rate": rate,
                             "interval_95": [max(rate - half, 0.0), rate + half]})  # fmt: skip
    print(json.dumps({"policy": vars(policy), "trials": args.trials, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
