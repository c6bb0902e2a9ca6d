"""Save a tiny randomly initialised T5 (and a smaller T5 draft) with a word-level tokenizer.

No weights are downloaded: the models are built from configs, as the tests do. They generate noise,
but they show the encoder-decoder path of specdec end to end:

    python scripts/tiny_t5.py /tmp/tiny-t5
    specdec generate "w6 w7 w8 w9 w6 w7" --target /tmp/tiny-t5/target --draft /tmp/tiny-t5/draft --dtype fp32
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tiny import tiny_seq2seq  # noqa: E402


def main(out: str) -> None:
    root = Path(out)
    for name, kwargs in (("target", dict(seed=0)), ("draft", dict(seed=1, d_model=32, layers=1))):
        model = tiny_seq2seq("t5", eos=None, **kwargs)
        model.hf_model.save_pretrained(root / name)
        model.tokenizer.save_pretrained(root / name)
        print(f"saved {root / name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny-t5")
