#!/usr/bin/env python3
"""Plots the stream sweep (tests/engine_vllm.rs stream_path_sweep_through_the_lb_and_direct,
run by scripts/bench-engine.sh --stream) and prints its table.

    plot-stream-sweep.py SWEEP_JSON OUT_PNG

Three panels by concurrency (1, 8, 32): time to the first token (p50 and
p99), the time between tokens (p50 and p99), and output tokens/s, through
the lb and against vLLM's own server in the same engine container. Prints
the Markdown table docs/serve.md carries, with the ratios. Needs matplotlib
(bench-engine.sh installs a pinned one into target/plot-venv).
"""

import json
import sys


def main():
    src, png = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        r = json.load(f)
    lb = {v["concurrency"]: v for v in r["lb"]}
    direct = {v["concurrency"]: v for v in r["direct"]}
    levels = sorted(set(lb) & set(direct))
    print("| concurrency | path | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | tokens/s | TTFT p50 lb - direct | tokens/s lb / direct |")
    print("|---|---|---|---|---|---|---|")
    for c in levels:
        for name, v in (("direct", direct[c]), ("lb", lb[c])):
            extra = ("", "")
            if name == "lb":
                extra = (f"{v['ttft_p50_ms'] - direct[c]['ttft_p50_ms']:+.1f} ms",
                         f"{v['tok_s'] / direct[c]['tok_s']:.3f}")
            print(f"| {c} | {name} | {v['ttft_p50_ms']:.1f} / {v['ttft_p99_ms']:.1f} | "
                  f"{v['itl_p50_ms']:.1f} / {v['itl_p99_ms']:.1f} | {v['tok_s']:.1f} | {extra[0]} | {extra[1]} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = [
        ("time to first token (ms)", [("ttft_p50_ms", "p50", "-"), ("ttft_p99_ms", "p99", ":")]),
        ("time between tokens (ms)", [("itl_p50_ms", "p50", "-"), ("itl_p99_ms", "p99", ":")]),
        ("output tokens/s", [("tok_s", "", "-")]),
    ]
    for ax, (title, series) in zip(axes, panels):
        for path, data, color in (("lb", lb, "tab:blue"), ("direct", direct, "tab:orange")):
            for key, label, style in series:
                ax.plot(levels, [data[c][key] for c in levels], style, marker="o", color=color,
                        label=f"{path} {label}".strip())
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    model = r.get("model") or {}
    fig.suptitle(
        f"Streamed answers of {r['tokens']} tokens, vLLM {r['vllm']} (CPU), "
        f"{(model.get('params') or 0) / 1e6:.0f} M-weight model: through the lb vs vLLM's own server")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    print(f"plot: {png}")


if __name__ == "__main__":
    main()
