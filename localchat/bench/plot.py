"""`localchat bench --plot FILE`: throughput and latency as a picture (matplotlib, an optional
dependency).

One run draws its systems side by side (localchat and its peers). Several online runs of the same
workload at different concurrency levels (`--plot-with` earlier runs' --json files) draw against
concurrency.
"""

from __future__ import annotations

import json

from localchat.errors import LocalchatError

INSTALL_HINT = 'pip install matplotlib  (or: pip install "localchat[plot]")'
_LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))


class PlotUnavailableError(LocalchatError):
    """--plot was asked for without matplotlib installed."""


def load_payload(path: str) -> dict:
    """A bench --json file."""
    try:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
    except (OSError, ValueError) as exc:
        raise LocalchatError(
            f"cannot read the bench results {path}: {exc}", param="plot_with"
        ) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("results"), dict):
        raise LocalchatError(f"{path} is not a `localchat bench --json` file", param="plot_with")
    return payload


def require_matplotlib():
    """matplotlib.pyplot, or a PlotUnavailableError saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailableError(f"--plot needs matplotlib: {INSTALL_HINT}") from None
    return plt


def _series(payloads: list[dict]) -> tuple[str, list, dict[str, list[dict]]]:
    """(x label, x values, {system: [figures per x]}): by concurrency for several online runs, else
    by system."""
    by_concurrency = len(payloads) > 1 and all(p.get("mode") == "online" for p in payloads)
    if by_concurrency:
        ordered = sorted(payloads, key=lambda p: p["workload"].get("concurrency") or 0)
        xs = [p["workload"].get("concurrency") or "all" for p in ordered]
        systems = {name for p in ordered for name in p["results"]}
        return (
            "concurrency",
            xs,
            {name: [p["results"].get(name, {}) for p in ordered] for name in sorted(systems)},
        )
    results = {name: fig for p in payloads for name, fig in p["results"].items()}
    return "system", list(results), {"": list(results.values())}


def plot_runs(payloads: list[dict], path: str) -> None:
    """Draw output tok/s and the TTFT/TPOT p50 (p99 as error bars' tops) of the runs into `path`
    (.png, .svg, .pdf: the format follows the name)."""
    plt = require_matplotlib()
    x_label, xs, series = _series(payloads)
    figure, (speed, latency) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    positions = list(range(len(xs)))
    for name, figs in series.items():
        throughput = [f.get("output_throughput") or 0 for f in figs]
        if x_label == "system":
            speed.bar(positions, throughput, color="tab:blue")
        else:
            speed.plot(xs, throughput, marker="o", label=name)
        for offset, (key, label) in enumerate(_LATENCIES):
            p50 = [(f.get(key) or {}).get("p50") or 0 for f in figs]
            p99 = [(f.get(key) or {}).get("p99") or 0 for f in figs]
            tag = f"{name} {label}".strip()
            if x_label == "system":
                shifted = [x + (offset - 0.5) * 0.38 for x in positions]
                latency.bar(
                    shifted,
                    p50,
                    width=0.38,
                    label=f"{label} p50",
                    yerr=[[0] * len(p50), [max(b - a, 0) for a, b in zip(p50, p99, strict=True)]],
                    capsize=3,
                )
            else:
                latency.plot(xs, p50, marker="o", label=f"{tag} p50")
    if x_label == "system":
        for axis in (speed, latency):
            axis.set_xticks(positions, xs)
    else:
        for axis in (speed, latency):
            axis.set_xlabel("concurrency")
        speed.legend()
    speed.set_ylabel("output tokens/s")
    speed.set_title("Throughput")
    latency.set_ylabel("ms (p50; bar tops to p99)" if x_label == "system" else "ms (p50)")
    latency.set_title("Latency")
    latency.legend()
    first = payloads[-1]
    figure.suptitle(
        f"localchat bench ({first.get('mode')}) - {first.get('model')} - {first.get('date', '')}"
    )
    try:
        figure.savefig(path)
    except (OSError, ValueError) as exc:
        raise LocalchatError(f"cannot write the plot {path}: {exc}", param="plot") from None
    finally:
        plt.close(figure)
