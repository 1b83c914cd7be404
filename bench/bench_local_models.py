"""Speed and memory of the built-in embeddings and OCR models, through the engines `orl serve` builds for them.

    .venv/bin/python bench/bench_local_models.py [--texts 2000] [--images 12]

Each model runs in a fresh process of its own (so its memory is its own): the engine is built from the built-in
catalog, loaded by one call (timed apart), then driven at the catalog's concurrency. Figures: load time,
embeddings/s for one-sentence requests and for requests of 32 texts, OCR seconds per image (one request at a time,
and the throughput at the catalog's concurrency), and the process RSS after loading and at its peak (VmHWM).
Beside each wall-clock figure, the CPU time the process spent per item: on a shared machine that one moves far
less with the other load than the wall clock does.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrelay.catalog import load_catalog  # noqa: E402
from openrelay.engines.factory import build_engine  # noqa: E402

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches in "
         "the old town hall near the river bank every sunday morning").split()


def rss_mib() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


async def drive(engine: Any, endpoint: str, bodies: list[dict[str, Any]], concurrency: int) -> tuple[float, float]:
    """(wall, CPU) seconds to answer every body with ``concurrency`` calls in flight; every answer must be a 200."""
    queue = iter(bodies)

    async def lane() -> None:
        for body in queue:
            reply = await engine.call(endpoint, body)
            assert reply.status_code == 200, reply.body

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return time.perf_counter() - start, time.process_time() - cpu


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(8 + i % 12)) + "."


def receipt() -> str:
    """A data URL of a rendered 12-line receipt (black on white, 1000 x 1040 px)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=36)
    image = Image.new("RGB", (1000, 1040), "white")
    draw = ImageDraw.Draw(image)
    for row in range(12):
        draw.text((40, 40 + 80 * row), f"Item {row + 1:02d}  {sentence(row)[:28]}", fill="black", font=font)
        draw.text((800, 40 + 80 * row), f"{(row + 1) * 3.25:.2f}", fill="black", font=font)
    png = io.BytesIO()
    image.save(png, "PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


async def bench_model(name: str, texts: int, images: int) -> dict[str, Any]:
    spec = load_catalog(None).models[name]
    engine = build_engine(spec)
    result: dict[str, Any] = {"model": name, "concurrency": spec.concurrency, "rss_start_mib": rss_mib()[0]}
    if "/v1/embeddings" in spec.endpoints:
        endpoint = "/v1/embeddings"
        result["load_s"] = (await drive(engine, endpoint, [{"input": "warm up"}], 1))[0]
        result["rss_loaded_mib"] = rss_mib()[0]
        for label, per_request in (("1_text", 1), ("32_texts", 32)):
            bodies = [{"input": [sentence(i) for i in range(start, start + per_request)]}
                      for start in range(0, texts, per_request)]
            wall, cpu = await drive(engine, endpoint, bodies, spec.concurrency)
            count = per_request * len(bodies)
            result[f"{label}_per_request_embeddings_per_s"] = count / wall
            result[f"{label}_per_request_cpu_ms_per_embedding"] = 1000 * cpu / count
    else:
        endpoint = "/v1/chat/completions"
        url = receipt()
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
        result["load_s"] = (await drive(engine, endpoint, [body], 1))[0]  # includes reading one image
        result["rss_loaded_mib"] = rss_mib()[0]
        for label, concurrency in (("one_at_a_time", 1), ("at_concurrency", spec.concurrency)):
            wall, cpu = await drive(engine, endpoint, [body] * images, concurrency)
            result[f"s_per_image_{label}"] = wall / images
            result[f"cpu_s_per_image_{label}"] = cpu / images
        reply = await engine.call(endpoint, body)
        result["lines_read"] = len(reply.body["choices"][0]["message"]["content"].splitlines())
    result["rss_peak_mib"] = rss_mib()[1]
    await engine.aclose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=2000, help="texts embedded in each embeddings run")
    parser.add_argument("--images", type=int, default=12, help="images read in each OCR run")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the child process: bench this one model
    args = parser.parse_args()
    if args.model:
        print(json.dumps(asyncio.run(bench_model(args.model, args.texts, args.images))))
        return
    for model in ("openrelay/minilm-l6", "openrelay/rapidocr"):
        done = subprocess.run([sys.executable, __file__, "--model", model, "--texts", str(args.texts),
                               "--images", str(args.images)], capture_output=True, text=True, check=True)
        figures = json.loads(done.stdout)
        print(f"{figures.pop('model')} (load average {Path('/proc/loadavg').read_text().split()[0]})")
        for key, value in figures.items():
            print(f"  {key:42} {value:.3f}" if isinstance(value, float) else f"  {key:42} {value}")


if __name__ == "__main__":
    main()
