"""What the OpenTelemetry hook costs an enqueue when opentelemetry is installed but no tracer provider is set.

    python bench/otel_cost.py [--calls 200] [--blocks 101] [--redis-url URL] [--quick]

Times `Queue.add` (which asks core/producing/tracing.py whether tracing is on: the
global provider is the API's stand-in, so it makes no span and stores
nothing) against the same add without the hook (`Queue._add` of
`Queue.encode`, what `add` does inside it), in interleaved blocks of
`--calls` adds each, the order swapped every block so a busy moment costs
both alike; the cost is the median of the blocks' ratios, in wall time and
in this process's CPU time (where the hook's work shows). Beside it, the hook
alone (the check and the call around the add, with an add that does nothing)
in µs, against one add: the same figure, free of Redis's noise. With the SDK
installed, one more row: an add with tracing on (a provider without
exporters), for scale. The keys go under a prefix of their own, deleted at the end.
"""

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_PERCENT = 2.0


def per_call_us(function, calls: int) -> float:
    return timed_us(function, calls)[0]


def timed_us(function, calls: int) -> tuple[float, float]:
    """µs per call of `function`, in wall time and in this process's CPU time (steadier on a busy machine)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        function()
    return (time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="adds per block")
    parser.add_argument("--blocks", type=int, default=101, help="blocks of each kind, interleaved")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 50 adds per block, 5 blocks")
    args = parser.parse_args()
    from echomq_django.core import NewJob, Queue, connect, send_traced, use_tracer_provider
    from echomq_django.core.producing import tracing

    if args.quick:
        args.calls, args.blocks = 50, 5
    client = connect(args.redis_url)
    queue = Queue("otelbench", client, prefix=f"bench{uuid.uuid4().hex[:8]}")
    data = {"args": ["Ada"], "kwargs": {}}

    def hooked() -> None:
        queue.add("greet", data)

    def bare() -> None:
        queue._add([queue.encode(NewJob("greet", data))])

    def nothing(trace: str) -> list[str]:
        return []

    try:
        hooked(), bare()  # the first add loads the script into Redis
        ratios: dict[str, list[float]] = {"wall": [], "CPU": []}
        hooked_us: list[float] = []
        bare_us: list[float] = []
        for block in range(args.blocks):
            pair = (hooked, bare) if block % 2 == 0 else (bare, hooked)
            times = {function: timed_us(function, args.calls) for function in pair}
            hooked_us.append(times[hooked][0])
            bare_us.append(times[bare][0])
            ratios["wall"].append(times[hooked][0] / times[bare][0])
            ratios["CPU"].append(times[hooked][1] / times[bare][1])
        hook_us = min(per_call_us(lambda: send_traced("otelbench", nothing), 100_000) for _ in range(5))
        add_us = statistics.median(bare_us)
        print(f"opentelemetry-api installed: {tracing.INSTALLED}; tracing on: {tracing.tracer() is not None}")
        print(f"{args.blocks} blocks of {args.calls:,} adds each, interleaved; Redis {client.info()['redis_version']}")
        print(f"{'':<46}{'µs per add':>12}")
        print(f"{'Queue.add, with the hook (no provider set)':<46}{statistics.median(hooked_us):>12.1f}")
        print(f"{'the same add without the hook':<46}{add_us:>12.1f}")
        for kind, values in ratios.items():
            quartiles = statistics.quantiles(values, n=4)
            print(f"cost, median of the blocks' ratios ({kind} time): {(statistics.median(values) - 1) * 100:+.2f}% "
                  f"(middle half of the ratios: {quartiles[0]:.3f} to {quartiles[2]:.3f})")
        hook_cost = hook_us / add_us * 100
        print(f"cost, the hook alone: {hook_us:.2f} µs per add, {hook_cost:.2f}% of an add "
              f"({'below' if hook_cost < TARGET_PERCENT else 'ABOVE'} the {TARGET_PERCENT:g}% target)")
        try:
            from opentelemetry.sdk.trace import TracerProvider
        except ImportError:
            print("with tracing on: not measured (opentelemetry-sdk is not installed)")
        else:
            provider = TracerProvider()  # spans are made and ended, and exported nowhere
            use_tracer_provider(provider)
            try:
                traced = statistics.median(per_call_us(hooked, args.calls) for _ in range(max(args.blocks // 4, 1)))
            finally:
                use_tracer_provider(None)
            print(f"{'with tracing on (a provider, no exporter)':<46}{traced:>12.1f}")
    finally:
        queue.obliterate()


if __name__ == "__main__":
    main()
