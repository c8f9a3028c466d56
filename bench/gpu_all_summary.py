"""bench/gpu_all.sh's summary: every phase's JSON (in WORK) → summary.md (one table naming each figure) and
results.json (all of them).

    python -m bench.gpu_all_summary WORK SUMMARY.md RESULTS.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def figures(work: Path) -> list[tuple[str, str, str, str]]:
    """(figure, value, target, phase status) rows."""
    phases = {}
    tsv = work / "phases.tsv"
    if tsv.is_file():
        for line in tsv.read_text().splitlines():
            name, rc, seconds, note = (line.split("\t") + ["", "", ""])[:4]
            phases[name] = (
                f"{'ok' if rc == '0' else ('skipped' if rc == 'skip' else f'exit {rc}')}, {seconds} s"
                + (f" ({note})" if note else "")
            )
    rows = []

    mfu = _load(work / "mfu.json")
    best = None
    if mfu and mfu.get("results"):
        values = [r["mfu"] for r in mfu["results"] if r.get("mfu") is not None]
        best = max(values) if values else None
        r0 = mfu["results"][0]
        label = f"MFU {mfu.get('cfg', '?').removesuffix('.yaml')} {r0['amp']} b{r0['batch']}"
    else:
        label = "MFU yolov5x bf16 b48"
    rows.append((label, _pct(best), ">= 40%", phases.get("mfu", "not run")))

    ours = _load(work / "ours_release_cfg.json")
    release = _load(work / "release.json")
    release_rate = {}
    if release:
        for r in release.get("rows", []):
            release_rate[r["batch"]] = (r["img_per_s"], r["step_ms_mean"])
    if ours and ours.get("results"):
        for r in ours["results"]:
            ref = release_rate.get(r["batch"])
            ratio = "-" if ref is None else f"{r['samples_per_s_per_gpu'] / ref[0]:.2f}x"
            rows.append(
                (
                    f"ours step {ours.get('cfg', '')} b{r['batch']} {r['amp']} (ms; x release img/s)",
                    f"{r['step_ms']:.1f} ms; {ratio}",
                    ">= 1.5x the release",
                    phases.get("release", "not run"),
                )
            )
    for batch, (rate, step_ms) in sorted(release_rate.items()):
        rows.append(
            (
                f"release step b{batch} fp16 (ms)",
                f"{step_ms:.1f} ms ({rate:.0f} img/s)",
                "-",
                phases.get("release_src", ""),
            )
        )
    if not release_rate:
        rows.append(("release step", "not measured", "-", phases.get("release_src", "not run")))

    real = _load(work / "real.json")
    busy = None
    if real and real.get("results"):
        r = real["results"][0]
        busy = max(0.0, 1.0 - r["data_wait_ms"] / r["step_ms"]) if r.get("step_ms") else None
    rows.append(
        (
            "real CPU loader busy (step not waiting on the host)",
            _pct(busy),
            ">= 95%",
            phases.get("real", "not run"),
        )
    )

    gpu = _load(work / "gpu_loader.json")
    if gpu:
        rows.append(
            (
                "GPU loader mosaics/s (training beside it)",
                _num(gpu.get("mosaics_per_s")),
                ">= 2,000",
                phases.get("gpu_loader", ""),
            )
        )
        rows.append(("GPU loader busy", _pct(gpu.get("busy")), ">= 95%", phases.get("gpu_loader", "")))
        rows.append(
            (
                "GPU loader device decode+augment ms/batch (CUDA events)",
                _num(gpu.get("device_assemble_ms_per_batch"), ".2f"),
                "-",
                "",
            )
        )
        rows.append(
            (
                "nvJPEG used",
                f"{gpu.get('nvjpeg_used')} ({gpu.get('device_decoded_files')} files, {gpu.get('fallback_decodes')} fallbacks)",
                "True",
                "",
            )
        )
        rows.append(
            (
                "decode race: corrupted images",
                f"{gpu.get('race_corrupted')} of {gpu.get('race_checked_images')}",
                "0",
                "",
            )
        )
    else:
        rows.append(("GPU loader mosaics/s", "not measured", ">= 2,000", phases.get("gpu_loader", "not run")))

    cluster = _load(work / "cluster" / "summary.json")
    checks = {c["check"]: c for c in (cluster or {}).get("checks", [])}
    for name, label in (
        ("train1", "cluster: --epochs 3 run stopped part-way"),
        ("resume", "resume check (stopped run, other AMP mode)"),
        ("val", "cluster: val 1 vs 2 ranks, same device"),
        ("ddp2", "cluster: 2 ranks, DDP"),
        ("syncs", "cluster: host syncs per step"),
    ):
        c = checks.get(name)
        rows.append(
            (
                label,
                "not run" if c is None else ("ok" if c["ok"] else "FAILED"),
                "ok",
                phases.get("cluster", "not run"),
            )
        )

    comp = _load(work / "compile.json")
    if comp:
        rows.append(
            (
                f"compiled vs eager grads after 4 micro-steps ({comp.get('compiled')})",
                f"max rel diff {comp['grad_max_rel_diff']:.1e}",
                "<= 1e-3",
                phases.get("compile", ""),
            )
        )
        rows.append(("compiled vs eager step speed-up", _num(comp.get("speedup"), ".2f"), "> 1", ""))
    else:
        rows.append(("compiled vs eager grads", "not measured", "<= 1e-3", phases.get("compile", "not run")))
    return rows


def main(work: str, md: str, out: str) -> None:
    folder = Path(work)
    env = _load(folder / "environment.json") or {}
    rows = figures(folder)
    lines = [
        f"# bench/gpu_all.sh: {env.get('gpu', '?')}, torch {env.get('torch', '?')}, commit {env.get('commit', '?')}",
        "",
        "| figure | value | target | phase |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    text = "\n".join(lines) + "\n"
    Path(md).write_text(text, encoding="utf-8")
    everything = {
        "environment": env,
        "figures": [dict(zip(("figure", "value", "target", "phase"), r)) for r in rows],
    }
    for path in sorted(folder.glob("*.json")):
        everything[path.stem] = _load(path)
    everything["cluster"] = _load(folder / "cluster" / "summary.json")
    Path(out).write_text(json.dumps(everything, indent=1) + "\n", encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main(*sys.argv[1:])
