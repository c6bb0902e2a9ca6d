#!/usr/bin/env python3
"""Build the fixed task data files shipped in src/specdec/tasks/data/ (run once; the output is committed).

    apt-get download trans-de-en && dpkg -x trans-de-en_*.deb /tmp/ding      # the Ding dictionary
    apt-get install -y manpages manpages-dev man-db                           # Linux man-pages
    python scripts/build_task_data.py --ding /tmp/ding/usr/share/trans/de-en

Writes:
  translation_en_de.jsonl   200 English -> German sentence pairs from the Ding dictionary (Debian trans-de-en)
  translation_de_corpus.txt 2,000 other German sentences of the same dictionary (n-gram draft corpus)
  summarization_manpages.jsonl  100 Linux man pages (sections 2 and 7): DESCRIPTION text + NAME one-liner

Selection is deterministic: candidates are filtered by the rules below, ordered by the sha256 of their
text, and the first N are taken. Rerunning on the same package versions gives the same files.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "src" / "specdec" / "bench" / "data"
END = re.compile(r"[.?!]$")
# Dictionary placeholders (something, somebody, etwas, jemanden...) and markup mark non-sentences.
PLACEHOLDER = re.compile(r"\b(sth|sb|sb's|etw|jd|jdn|jdm|jds)\.", re.IGNORECASE)
MARKUP = re.compile(r"[{}\[\]<>/()=~+|]")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def translation_pairs(path: Path) -> tuple[list[dict], str]:
    """Clean one-to-one sentence pairs of the Ding dictionary, in sha256 order, and its version line."""
    version = ""
    seen_en: set[str] = set()
    seen_de: set[str] = set()
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("#"):
                if line.startswith("# Version"):
                    version = line.split("::", 1)[-1].strip()
                continue
            if " :: " not in line:
                continue
            de_side, en_side = line.split(" :: ", 1)
            de_senses, en_senses = de_side.split(" | "), en_side.split(" | ")
            if len(de_senses) != len(en_senses):
                continue
            for de, en in zip(de_senses, en_senses):
                de, en = de.strip(), en.strip()
                if "; " in de or "; " in en:  # alternatives: keep only one-to-one pairs
                    continue
                if not (6 <= len(en.split()) <= 30 and len(de.split()) >= 4):
                    continue
                if not (END.search(en) and END.search(de)) or MARKUP.search(en + de) or PLACEHOLDER.search(en + " " + de):
                    continue
                key_en, key_de = en.lower(), de.lower()
                if key_en in seen_en or key_de in seen_de:
                    continue
                seen_en.add(key_en)
                seen_de.add(key_de)
                pairs.append({"source": en, "reference": de})
    pairs.sort(key=lambda p: _digest(p["source"] + "\t" + p["reference"]))
    return pairs, version


def man_pages(sections: tuple[str, ...] = ("2", "7")) -> list[dict]:
    """Linux man pages of the Debian manpages / manpages-dev packages: DESCRIPTION + NAME summary."""
    files = []
    for package in ("manpages", "manpages-dev"):
        listing = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True).stdout
        for name in listing.split():
            if re.search(r"/usr/share/man/man(" + "|".join(sections) + r")/[^/]+\.gz$", name):
                files.append((package, Path(name)))
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "manpages"], capture_output=True, text=True).stdout
    items = []
    for package, path in files:
        if path.is_symlink():
            continue
        source = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
        if source.lstrip().startswith(".so "):  # an alias page
            continue
        spdx = re.search(r"SPDX-License-Identifier:\s*(.+)", source)
        if spdx is None or "BSD-4-Clause" in spdx.group(1):  # licence unclear, or the advertising clause
            continue
        copyright_lines = [m.strip() for m in re.findall(r'^\.\\"\s*(Copyright.*)$', source, re.MULTILINE)]
        env = dict(os.environ, MANWIDTH="5000", LC_ALL="C.UTF-8")
        rendered = subprocess.run(["man", "--nh", "--nj", "-P", "cat", "-l", str(path)], capture_output=True,
                                  text=True, env=env).stdout
        sections_text = _sections(rendered)
        name_line = " ".join(sections_text.get("NAME", "").split())
        description = sections_text.get("DESCRIPTION", "")
        if " - " not in name_line or not description:
            continue
        summary = name_line.split(" - ", 1)[1].strip()
        text = _cut(description, 1600)
        if len(text) < 700 or len(summary.split()) < 2:
            continue
        page = path.name[: -len(".gz")]
        title, section = page.rsplit(".", 1)
        items.append({
            "id": f"{title}({section})",
            "text": text,
            "reference": summary,
            "license": spdx.group(1).strip(),
            "copyright": copyright_lines,
            "source": f"Debian {package} {version}: {path}",
        })
    items.sort(key=lambda item: _digest(item["id"]))
    return items


def _sections(rendered: str) -> dict[str, str]:
    """Split a man page rendered as text into its top-level sections (headings in column 0)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in rendered.splitlines():
        if line and not line[0].isspace():
            current = line.strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def _cut(description: str, limit: int) -> str:
    """The first paragraphs of a section, whitespace normalised, up to ``limit`` characters."""
    paragraphs, kept, size = [], [], 0
    block: list[str] = []
    for line in description.splitlines() + [""]:
        if line.strip():
            block.append(line.strip())
        elif block:
            paragraphs.append(re.sub(r"\s+", " ", " ".join(block)))
            block = []
    for paragraph in paragraphs:
        if size + len(paragraph) > limit and kept:
            break
        kept.append(paragraph)
        size += len(paragraph) + 2
    return "\n\n".join(kept)[: limit + 400]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ding", default="/usr/share/trans/de-en", help="the Ding dictionary file (Debian trans-de-en)")
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--corpus", type=int, default=2000)
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument("--out", default=str(DATA))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    pairs, version = translation_pairs(Path(args.ding))
    print(f"Ding {version}: {len(pairs)} candidate sentence pairs")
    chosen = pairs[: args.pairs]
    with open(out / "translation_en_de.jsonl", "w", encoding="utf-8") as f:
        for i, pair in enumerate(chosen):
            f.write(json.dumps({"id": f"ding-{i:03d}", **pair}, ensure_ascii=False) + "\n")
    corpus = [p["reference"] for p in pairs[args.pairs: args.pairs + args.corpus]]
    (out / "translation_de_corpus.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")

    pages = man_pages()
    print(f"man pages: {len(pages)} candidates")
    with open(out / "summarization_manpages.jsonl", "w", encoding="utf-8") as f:
        for page in pages[: args.pages]:
            f.write(json.dumps(page, ensure_ascii=False) + "\n")
    print(f"wrote {len(chosen)} pairs, {len(corpus)} corpus sentences, {min(len(pages), args.pages)} pages to {out}")


if __name__ == "__main__":
    main()
