"""The human-readable report of bench/bench_fitness.py's numbers (its --json line holds the same)."""
from __future__ import annotations


def report(res: dict) -> str:
    """The human-readable report of ``measure_all``'s numbers."""
    s = res["settings"]
    lines = [res["host"], f"device: {res['device']} ({res['device_name']}), torch {res['torch']}",
             f"resnet18, {s['epochs']} epochs, batch {s['batch']}, lr {s['lr']:g}, {s['images']} synthetic images "
             f"({s['train_images']} train / {s['val_images']} val), {s['steps']} timed steps after {s['warmup']}; "
             f"compile={s['compile']} measure_op={s['measure_op']} fused_adam={s['fused_adam']} "
             f"cudagraphs={s['cudagraphs']} triton={s['triton']} graphs={s['graphs']} counts={s['counts']}"]
    if "binary_images_per_s" in res:  # not with --full-only
        lines.append(f"binary {res['genome']}: {res['binary_images_per_s']:.0f} images/s" + (
            "" if res["float_images_per_s"] is None else f"   float: {res['float_images_per_s']:.0f} images/s   "
            f"binary/float {res['binary_vs_float']:.2f}x"))
        lines += _report_rest(res)
    if "full_evaluation" in res:
        f = res["full_evaluation"]
        lines.append(f"one whole evaluation ({f['genome']}, {f['train_images']} train / {f['val_images']} val, "
                     f"{f['steps']} steps): {f['seconds']:.1f} s")
    return "\n".join(lines)


def _report_rest(res: dict) -> list[str]:
    lines = []
    for mode, t in res["first_step_s"].items():
        lines.append(f"new genome to first step, {mode}: {t['first_genome']:.2f} s (first in the process), "
                     f"{t['new_genome']:.2f} s (a new one: {res['new_genome']})")
    lines.append(f"one evaluation (extrapolated): {res['evaluation_s']:.1f} s = {res['extrapolation']}")
    for row in res["concurrent"]:
        if "error" in row:
            lines.append(f"K={row['k']}: failed: {row['error']}")
        else:
            lines.append(f"K={row['k']}: {row['images_per_s']:.0f} images/s aggregate, "
                         f"{row['evaluations_per_hour']:.1f} evaluations/hour "
                         f"({row['evaluations_per_hour_incl_overhead']:.1f} with validation and set-up)")
    for row in res.get("in_process", []):
        if "error" in row:
            lines.append(f"{row['k']} models in this process: failed: {row['error']}")
            continue
        lines.append(f"{row['k']} models in this process ({'one CUDA stream each' if row['streams'] else 'in turn'}): "
                     f"{row['images_per_s']:.0f} images/s aggregate, {row['evaluations_per_hour']:.1f} evaluations/hour "
                     f"({row['evaluations_per_hour_incl_overhead']:.1f} with validation and set-up)")
    return lines
