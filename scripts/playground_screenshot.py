"""A screenshot of the playground page (README): drives a running `specdec serve` in the system's Chromium.

    specdec serve &                                  # the packaged 1.5B with its default draft
    python scripts/playground_screenshot.py --out docs/images/playground.png

Races plain against speculative decoding on one prompt (greedy) and saves the page once both finished.
"""

from __future__ import annotations

import argparse
import shutil

from playwright.sync_api import sync_playwright

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/")
    parser.add_argument("--out", default="docs/images/playground.png")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--mode", choices=["race", "generate"], default="race")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(args.url)
        page.wait_for_function("document.body.dataset.state === 'ready'", timeout=600_000)
        page.fill("#prompt", args.prompt)
        page.fill("#max-tokens", str(args.max_tokens))
        page.click("#race" if args.mode == "race" else "#generate")
        page.wait_for_function("['done', 'error'].includes(document.body.dataset.state)", timeout=1_200_000)
        page.screenshot(path=args.out, full_page=True)
        print({k: page.text_content(f"#{k}") for k in ("stat-tps", "stat-calls", "stat-mal", "stat-acc", "stat-alpha",
                                                       "stat-c", "stat-expected", "stat-measured", "speed-plain",
                                                       "speed-spec", "race-verdict", "error")})
        browser.close()


if __name__ == "__main__":
    main()
