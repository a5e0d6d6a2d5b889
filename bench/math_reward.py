"""What the `boxed` reward costs per completion: N completions (a short reasoning text ending in a boxed answer,
right and wrong ones, of the common MATH-style kinds of tests/test_math_answers.py, every number different so that
math-verify's small parse cache answers nothing) scored in one batch call, in this process's main thread as a
reward worker runs them, after a warm-up call (imports); wall and CPU time (the CPU time is the number to read on a
shared machine). Three mixes: integer answers only (GSM8K, AIME), LaTeX
answers only (fractions, roots, intervals, sets, tuples, percentages, units, degrees, powers, binomials,
polynomials), and all of them. Run it with another checkout first on PYTHONPATH to time that checkout's `boxed`
on the same completions.

Usage: python bench/math_reward.py [--n 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report

INTEGER_KINDS = 3  # the first kinds of `answers`


def answers(k: int) -> list[tuple[str, str]]:
    """(answer in the box, ground truth) pairs, one per kind, their numbers made from `k`."""
    return [
        (f"{k}", f"{k}"),
        (f"-{k}", f"{k}"),
        (f"{k + 1}", f"{k}"),
        (rf"\frac{{1}}{{{k}}}", rf"\frac{{1}}{{{k}}}"),
        (rf"{k}\sqrt{{2}}", rf"\sqrt{{{2 * k * k}}}"),
        (f"[0,{k})", f"[0,{k}]"),
        (rf"\{{{k},{k + 1}\}}", rf"\{{{k + 1},{k}\}}"),
        (f"({k},-1)", f"({k}, -1)"),
        (rf"{k}\%", f"{k / 100}"),
        (rf"{k}\text{{ cm}}", f"{k}"),
        (rf"{k}^\circ", f"{k}"),
        (f"{k}^{{2}}", f"{k * k}"),
        (rf"\binom{{{k}}}{{2}}", f"{k * (k - 1) // 2}"),
        (f"x^2+{k}x", f"x(x+{k})"),
    ]


def completions(n: int, kinds: slice) -> tuple[list[str], list[str]]:
    """n completions of the `kinds` of answers and their ground truths."""
    pairs = [p for k in range(2, 2 + n) for p in answers(k)[kinds]][:n]
    texts = [f"Step 1: set up the equation. Step 2: solve it. So the answer is \\boxed{{{b}}}." for b, _ in pairs]
    return texts, [t for _, t in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import rlctl
    from rlctl.rewards import boxed

    boxed([""], [r"\boxed{\frac{1}{2}}"], answer=["0.5"])  # imports, the grammar's first parse
    source = str(Path(rlctl.__file__).resolve().parent.parent)
    rows, payload = [], {"rlctl": source, "n": args.n}
    mixes = {"integers": slice(0, INTEGER_KINDS), "latex": slice(INTEGER_KINDS, None), "all": slice(None)}
    for mix, kinds in mixes.items():
        texts, truths = completions(args.n, kinds)
        runs, cpu = [], []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            scores = boxed([""] * len(texts), texts, answer=truths)
            runs.append((time.perf_counter() - start) * 1000 / len(texts))
            cpu.append((time.process_time() - start_cpu) * 1000 / len(texts))
        mean = sum(scores) / len(scores)
        ms, cpu_ms = statistics.median(runs), statistics.median(cpu)
        rows.append([mix, ms, cpu_ms, mean])
        payload[mix] = {"ms_per_completion": ms, "cpu_ms_per_completion": cpu_ms, "runs_ms": runs, "mean_score": mean}
    report(
        "math_reward",
        f"boxed ({source}): ms per completion, {args.n} completions, median of {args.repeat} batch calls",
        ["answers", "ms/completion", "CPU ms/completion", "mean score"],
        rows,
        payload,
    )


if __name__ == "__main__":
    main()
