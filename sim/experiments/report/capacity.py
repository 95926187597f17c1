"""The report of a capacity search (``priosim capacity``): each design's answer (the fewest
replicas meeting every SLO) with its margin, and every probe of the search (replicas against
the worst class's ratio to its SLO).

The *margin* of an answer: how far its worst class stays under its SLO (1 - worst p99/SLO
ratio: 0.2 means 20 % headroom), and the largest count the search saw miss the SLOs (the answer
is exact when that is one less). Reads ``capacity.json`` (required).
"""
from __future__ import annotations

import json
from pathlib import Path

from sim.core.errors import ScenarioError
from sim.experiments.report import read
from sim.experiments.report.page import PALETTE, Page, empty, hline, layout


def worst(point: dict) -> float | None:
    """The probe's worst class ratio to its SLO (classes a stopped probe did not judge left out)."""
    vals = [m.get("slo_ratio") for m in (point.get("classes") or {}).values() if isinstance(m, dict)]
    vals = [v for v in vals if isinstance(v, (int, float))]
    return max(vals) if vals else None


def nearest_misses(doc: dict, design: str, split: dict) -> dict:
    """Per searched count of ``design`` (a partition, or the shared pool): the largest count a
    probe saw miss that count's SLOs (a partition is judged on its own class alone). The
    disaggregated design's roles (``split``: its answer): the largest count of a role that missed
    with the other role at its answer's count or more (so fewer of that role would not do)."""
    out = {}
    pts = [p for p in doc.get("points", []) if p.get("design") == design]
    answer = list(split.values()) if design == "disaggregated" else None  # (roles, judged on every class)
    for i, name in enumerate(split):
        misses = []
        for p in pts:
            counts = p.get("counts") or []
            if i >= len(counts) or counts[i] is None:
                continue
            if answer is not None and any(not isinstance(k, int) or k < a for j, (k, a) in
                                          enumerate(zip(counts, answer)) if j != i):
                continue
            cl = p.get("classes") or {}
            own = name in cl and answer is None
            judged = [cl[name]] if own else list(cl.values())
            if any(isinstance(m, dict) and m.get("ok") is False for m in judged) or (not own and not p.get("ok")):
                misses.append(counts[i])
        out[name] = max(misses) if misses else None
    return out


def margins(doc: dict) -> list[dict]:
    """Per design: the answer, its worst SLO ratio and headroom, and the nearest misses below."""
    rows = []
    for d, a in (doc.get("designs") or {}).items():
        split = a.get("split") or {}
        ratio = worst(a) if a.get("classes") else None
        miss = nearest_misses(doc, d, split)
        u = a.get("uncertainty") or {}
        gpus = a.get("gpus")
        if u and gpus is not None:  # (capacity's --uncertainty, on by default: "N (lo-hi)")
            gpus = f"{gpus} ({u.get('gpus_lo')}-{'more than the search limit' if u.get('gpus_hi') is None else u['gpus_hi']})"
        roles = ", ".join(f"{r} {a[f'gpus_{r}']}" for r in ("prefill", "decode")
                          if a.get(f"gpus_{r}") is not None) or None
        rows.append({"design": d, "meets the SLOs": a.get("ok"), "replicas": a.get("replicas"),
                     "GPUs": gpus, "GPUs per role": roles,
                     "split": ", ".join(f"{k}={v}" for k, v in split.items()) or None,
                     "worst p99/SLO": ratio, "headroom": None if ratio is None else 1 - ratio,
                     "largest miss": ", ".join(f"{k}={'none' if v is None else v}" for k, v in miss.items()) or None,
                     "utilisation": a.get("utilisation"),
                     "probes": sum(1 for p in doc.get("points", []) if p.get("design") == d), "note": a.get("note")})
    return rows


def probes_chart(doc: dict) -> dict:
    designs = list(doc.get("designs") or {}) or list(dict.fromkeys(p.get("design") for p in doc.get("points", [])))
    data = []
    xs = [p.get("replicas") for p in doc.get("points", []) if isinstance(p.get("replicas"), int)]
    for j, d in enumerate(designs):
        color = PALETTE[j % len(PALETTE)]
        pts = [p for p in doc.get("points", []) if p.get("design") == d and worst(p) is not None]
        for ok, name, sym in ((True, "meets", "circle"), (False, "misses", "circle-open")):
            sel = [p for p in pts if bool(p.get("ok")) == ok]
            if not sel:
                continue
            data.append({"type": "scatter", "mode": "markers", "name": f"{d}: {name}", "legendgroup": d,
                         "x": [p.get("replicas") for p in sel], "y": [worst(p) for p in sel],
                         "marker": {"color": color, "symbol": sym, "size": 11, "line": {"width": 2, "color": color}},
                         "customdata": [_hover(p) for p in sel],
                         "hovertemplate": "%{customdata}<extra></extra>"})
        a = (doc.get("designs") or {}).get(d) or {}
        if a.get("replicas") and worst(a) is not None:
            data.append({"type": "scatter", "mode": "markers", "name": f"{d}: answer", "legendgroup": d,
                         "x": [a["replicas"]], "y": [worst(a)],
                         "marker": {"color": color, "symbol": "star", "size": 18, "line": {"width": 1, "color": "#000"}},
                         "hovertemplate": f"{d} answer: {a['replicas']} replicas<br>worst p99/SLO %{{y:.3g}}"
                                          "<extra></extra>"})
    if not data:
        return empty("Probes", "no probe judged a class against its SLO")
    if xs:
        data.append(hline(1.0, (min(xs) - 0.5, max(xs) + 0.5), "#000000", "SLO (ratio 1)"))
    return {"data": data, "layout": layout("Every probe of the search (each a full simulation)",
                                           "replicas in the probe (total)", "worst class: p99 / SLO "
                                           "(or last finish / deadline), log", yaxis={"type": "log"},
                                           xaxis={"dtick": 1})}


def _hover(p: dict) -> str:
    counts = ", ".join("-" if k is None else str(k) for k in p.get("counts", []))
    lines = [f"{p.get('design')} [{counts}]: {'meets' if p.get('ok') else 'misses'} the SLOs"]
    for c, m in (p.get("classes") or {}).items():
        if isinstance(m, dict) and m.get("slo_ratio") is not None:
            lines.append(f"{c}: p99/SLO {m['slo_ratio']:.3g}")
    if p.get("stopped_at_s") is not None:
        lines.append(f"stopped early at {p['stopped_at_s']:.4g} s (a miss was certain)")
    return "<br>".join(lines)


def gpus_chart(doc: dict) -> dict:
    designs = doc.get("designs") or {}
    parts = list(dict.fromkeys(k for a in designs.values() for k in (a.get("split") or {})))
    data = []
    for i, part in enumerate(parts):
        data.append({"type": "bar", "name": part, "x": list(designs),
                     "y": [(a.get("split") or {}).get(part) if a.get("replicas") else None for a in designs.values()],
                     "marker": {"color": "#555555" if part == "shared" else PALETTE[i % len(PALETTE)]},
                     "hovertemplate": f"%{{x}}: {part} %{{y}} replicas<extra></extra>"})
    if not data:
        return empty("Replicas per design", "no design met the SLOs")
    unc = {d: a["uncertainty"] for d, a in designs.items() if a.get("uncertainty") and a.get("gpus") is not None}
    if unc:  # the 80 % interval of the GPU count as an error bar on the replicas' stack (GPUs per
        # replica as at the answer; no upper end: beyond the search limit)
        xs = list(unc)
        per = [designs[d]["gpus"] / (designs[d].get("replicas") or designs[d]["gpus"]) for d in xs]
        ys = [designs[d]["gpus"] / p for d, p in zip(xs, per)]
        hi = [(u["gpus_hi"] if u["gpus_hi"] is not None else designs[d]["gpus"]) / p
              for d, u, p in zip(xs, unc.values(), per)]
        data.append({"type": "scatter", "mode": "markers", "name": "80 % interval", "x": xs, "y": ys,
                     "marker": {"color": "#000000", "size": 7, "symbol": "line-ew-open"},
                     "error_y": {"type": "data", "symmetric": False, "array": [h - y for h, y in zip(hi, ys)],
                                 "arrayminus": [y - u["gpus_lo"] / p for y, u, p in zip(ys, unc.values(), per)],
                                 "thickness": 1.5, "width": 10},
                     "hovertemplate": "%{x}: %{y} replicas (the bar: the cost model's 80 % interval)"
                                      "<extra></extra>"})
    return {"data": data, "layout": layout("Replicas (GPUs) each design needs", "design", "replicas",
                                           barmode="stack")}


def build(folder: Path) -> Page:
    doc = read.json_file(folder / "capacity.json")
    if not isinstance(doc.get("designs"), dict) or not isinstance(doc.get("points", []), list):
        raise ScenarioError(f"{folder / 'capacity.json'}: no 'designs' table or 'points' list (expected the file "
                            f"priosim capacity wrote)")
    page = Page(f"Capacity: {doc.get('scenario', folder.name)}",
                f"{len(doc.get('points', []))} probes · {len(doc['designs'])} designs · folder {folder.name}")
    page.section("The answer")
    rows = margins(doc)
    page.cards([(f"{r['design']}: replicas", r["replicas"] if r["replicas"] is not None else "not found",
                 "ok" if r["meets the SLOs"] else "bad") for r in rows]
               + [(f"{r['design']}: headroom under the SLO", f"{r['headroom']:.0%}" if r["headroom"] is not None
                   else "-", "") for r in rows])
    page.note("headroom = 1 - the worst class's p99/SLO at the answer (how much slower it could get and still "
              "pass); 'largest miss': per searched count, the largest one a probe saw miss the SLOs (one less "
              "than the answer: no fewer replicas would do; 'none': even 1 replica meets them).")
    page.table(rows)
    if any((a.get("uncertainty") for a in doc["designs"].values())):
        page.note("GPUs (lo-hi): the 80 % interval from the cost model's error (searched again at the binding "
                  "metric kinds' low and high time factors); docs/uncertainty.md")
    page.heading("The SLOs searched for")
    page.table([{"class": c, "TTFT p99 <= (s)": s.get("ttft"), "TPOT p99 <= (s)": s.get("tpot"),
                 "all done by (simulated s)": s.get("done")} for c, s in (doc.get("slos") or {}).items()])
    page.section("The search")
    page.open_grid()
    page.chart(probes_chart(doc), height=420)
    page.chart(gpus_chart(doc), height=420)
    page.close_grid()
    page.heading("Each answer's classes")
    page.table([{"design": d, "class": c, "p99 TTFT (s)": m.get("ttft_p99_s"), "p99 TPOT (s)": m.get("tpot_p99_s"),
                 "last finish (s)": m.get("last_finish_s"), "output tok/s": m.get("output_tokens_per_s"),
                 "p99/SLO": m.get("slo_ratio"), "meets": m.get("ok")}
                for d, a in doc["designs"].items() for c, m in (a.get("classes") or {}).items() if isinstance(m, dict)])
    page.pre("capacity.json", json.dumps(doc, indent=1))
    return page
