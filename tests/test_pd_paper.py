"""scripts/pd_paper.py, the parts that run without prefill/decode pools: the two ways a probe is
judged, the early stop agreeing with a full run, the GPUs a design counts, the rate search
bracketing the co-located goodput, the ShareGPT table written as DistServe filtered it, and the
paper scenarios naming only files of their own folder. The disaggregated comparison itself waits
for prefill/decode pools. Seeded; inequalities, not golden values."""
import gzip

import numpy as np
import pandas as pd
import pytest

from scripts import pd_paper


def _table(ttft, tpot, status=None):
    n = len(ttft)
    return pd.DataFrame({"status": status or ["finished"] * n, "ttft_s": ttft, "tpot_s": tpot})


def test_p90_judges_each_slo_alone_and_attainment_judges_both_per_request():
    # 20 requests: two with a slow first token, two others with a slow token rate: each P90
    # (linear, between the 18th and 19th values) stays within its SLO, but only 16 of 20 meet both
    ttft = [0.5, 0.5] + [0.1] * 18
    tpot = [0.01, 0.01, 0.05, 0.05] + [0.01] * 16
    t = _table(ttft, tpot)
    assert pd_paper.Criterion(0.4, 0.04, "p90").met(t)
    assert not pd_paper.Criterion(0.4, 0.04, "attainment").met(t)  # 16/20 < 90 %
    assert pd_paper.Criterion(0.4, 0.04, "attainment", target=0.8).met(t)
    assert not pd_paper.Criterion(0.4, 0.04, "p90").met(_table([0.5] * 3 + [0.1] * 17, [0.01] * 20))
    # a one-token answer (no TPOT) meets any TPOT SLO; an unfinished request meets nothing
    assert pd_paper.Criterion(None, 0.04, "attainment", target=1.0).met(_table([0.1, 0.1], [np.nan, 0.01]))
    assert not pd_paper.Criterion(0.4, None, "p90").met(_table([0.1, 0.1], [0.01, 0.01], ["finished", "unfinished"]))


def test_gpus_count_replicas_times_tp_and_roles():
    assert pd_paper.gpus(pd_paper.read("distserve_fig1_colocated")) == 1
    assert pd_paper.gpus(pd_paper.read("distserve_fig1_disaggregated")) == 3
    decode_only = pd_paper.read("distserve_fig1_decode_only")
    assert (pd_paper.gpus(decode_only), pd_paper.gpus(decode_only, "decode")) == (5, 1)
    assert pd_paper.gpus(pd_paper.read("distserve_opt13b_sharegpt_disaggregated")) == 3  # P TP 2 + D TP 1


@pytest.mark.parametrize("rate", [2.0, 12.0])
def test_an_early_stopped_probe_reaches_the_full_runs_verdict(rate, monkeypatch):
    doc = pd_paper.read("distserve_fig1_colocated")
    crit = pd_paper.criterion_of(doc, "p90")
    stopped = pd_paper.probe(doc, rate, 200, [0, 1], crit)

    class Silent(pd_paper.Watch):
        def __call__(self, req, now_ns):  # counts, never stops
            pass

    monkeypatch.setattr(pd_paper, "Watch", Silent)
    assert pd_paper.probe(doc, rate, 200, [0, 1], crit) == stopped
    assert stopped is (rate == 2.0)  # 2 req/s is served within the SLOs, 12 is far past them


def test_the_search_brackets_the_co_located_goodput_and_slower_steps_lower_it():
    kw = dict(requests=200, seeds=[0], rel=0.05)
    fast = pd_paper.per_gpu("distserve_fig1_colocated", "p90", **kw)
    slow = pd_paper.per_gpu("distserve_fig1_colocated", "p90", cost_scale=1.5, **kw)
    assert 0 < slow < fast
    doc = pd_paper.read("distserve_fig1_colocated")
    crit = pd_paper.criterion_of(doc, "p90")
    assert pd_paper.probe(doc, fast, 200, [0], crit) and not pd_paper.probe(doc, fast * 1.1, 200, [0], crit)


def test_sharegpt_table_is_distserves_filter_and_byte_stable(tmp_path):
    d = pd_paper.sharegpt_under_2048()
    total = d["num_prefill_tokens"] + d["num_decode_tokens"]
    assert len(d) == 14561 and total.max() < 2048
    a, b = tmp_path / "a.csv.gz", tmp_path / "b.csv.gz"
    pd_paper.write_lengths(a)
    pd_paper.write_lengths(b)
    shipped = pd_paper.PAPERS / "data" / "sharegpt_under_2048.csv.gz"
    assert a.read_bytes() == b.read_bytes() == shipped.read_bytes()
    assert gzip.decompress(a.read_bytes()).startswith(b"num_prefill_tokens,num_decode_tokens\n")


def test_distserves_sample_takes_the_first_turns_as_the_prompt_and_the_next_as_the_answer():
    """scripts/make_distserve_sharegpt.py as DistServe's artifact samples: conversations of three
    turns or more, k of the first turns (1 <= k < turns) joined by newlines, turn k the answer,
    the 2048-token and both-under-4 filters; the shipped table keeps to them."""
    import random

    from scripts import make_distserve_sharegpt as m

    def turns(*vals):
        return [{"value": v} for v in vals]

    convs = [turns("aa", "bbbb"), turns("a", "bb", "ccc"), turns("a" * 10, "b" * 20, "c" * 30, "d" * 40),
             turns("x" * 3000, "y", "z")]
    got = m.rows(convs, list)  # (one token a character)
    rng = random.Random(m.SEED)
    k1, k2 = rng.randint(1, 2), rng.randint(1, 3)  # (the 2-turn one is skipped: no draw)
    want = [(len("\n".join(["a", "bb", "ccc"][:k1])), len(["a", "bb", "ccc"][k1])),
            (len("\n".join(["a" * 10, "b" * 20, "c" * 30, "d" * 40][:k2])), [10, 20, 30, 40][k2])]
    assert got == want  # (the last: a 3000-token prompt, over 2048 whatever its k)
    d = pd.read_csv(pd_paper.PAPERS / "data" / "sharegpt_distserve_cl100k.csv.gz")
    p, o = d["num_prefill_tokens"], d["num_decode_tokens"]
    assert len(d) == 13296 and (p + o).max() < 2048 and not ((p < 4) & (o < 4)).any()
    assert p.mean() == pytest.approx(743.3, abs=0.1) and o.mean() == pytest.approx(189.7, abs=0.1)


def test_table2_crossings_are_the_pages_published_goodputs():
    assert pd_paper.crossing(pd_paper.TABLE2["vllm"]) == pytest.approx(1.111, abs=1e-3)
    assert pd_paper.crossing(pd_paper.TABLE2["distserve"]) == pytest.approx(2.3875)
    assert pd_paper.PUBLISHED["t2"].published == pytest.approx(2.15, abs=0.005)


def test_the_watch_stops_only_once_the_miss_is_certain():
    """100 requests judged on 90 % attainment: 10 misses still meet it, the 11th cannot."""
    watch = pd_paper.Watch(pd_paper.Criterion(0.25, 0.1, "attainment"), 100)
    assert watch.need == 11
    assert pd_paper.Watch(pd_paper.Criterion(0.4, 0.04, "p90"), 300).need == 31  # 300 - floor(299 x 0.9)


def test_every_published_row_names_its_source_and_the_band_is_symmetric():
    for c in pd_paper.PUBLISHED.values():
        assert c.source and c.published > 1
    assert pd_paper.verdict(2.1 * 1.2, 2.1) == "reproduced"
    assert pd_paper.verdict(2.1 * 0.7, 2.1) == "not reproduced"
    assert pd_paper.verdict(0.9, 0.8) == "not reproduced"  # disaggregation must win
