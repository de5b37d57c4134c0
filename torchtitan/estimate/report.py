"""Human-readable reports of the estimates (the JSON carries the same numbers)."""

from __future__ import annotations


def _gib(x: float) -> str:
    return f"{x:7.2f} GiB"


def training_report(r: dict) -> str:
    hw, lay, m = r["hardware"], r["layout"], r["model"]
    lines = [
        f"model      {m['name']} {m['flavor']}: {m['params']:,} parameters ({m['flop_params']:,} in matmuls)",
        f"hardware   {hw['num_devices']} x {hw['name']} ({hw['source']}; {hw['bf16_tflops']:.0f} TFLOPS bf16,"
        f" {hw['memory_gib']:.1f} GiB, {hw['hbm_gbps']:.0f} GB/s; {hw['devices_per_node']} per node"
        + (", each pair linked directly" if hw.get("intra_node_topology") == "mesh" else "")
        + (f"; compute at {hw['compute_power_w']:.0f} W" if hw.get("compute_power_w") else "")
        + (f", SM clock locked at {hw['sm_clock_mhz']:.0f} MHz" if hw.get("sm_clock_mhz") else "")
        + ")"
        + (" [calibrated]" if hw["calibrated"] else ""),
        f"layout     dp_replicate {lay['dp_replicate']} x dp_shard {lay['dp_shard']} x cp {lay['cp']} x tp {lay['tp']}"
        f" x pp {lay['pp']}"
        + (f" ({lay['pp_schedule']}, {lay['pp_microbatches']} micro-batches)" if lay["pp"] > 1 else ""),
        f"batch      {lay['local_batch_size']} x {lay['seq_len']} per dp rank and micro-step,"
        f" {lay['grad_accumulation_steps']} micro-step(s), {r['tokens_per_step']:,} tokens per step",
        f"options    AC {lay['ac_mode']}, compile {'+'.join(lay['compile']) or 'off'}, float8 {'on' if lay['float8'] else 'off'}",
        "",
        f"memory     {r['memory_gib']:.2f} GiB peak per device of {hw['memory_gib']:.1f} -> "
        + ("FITS" if r["fits"] else "DOES NOT FIT")
        + (" (may be low: see 'not priced')" if "not_priced" in r else "")
        + (f" (pipeline rank {r['peak_pipeline_rank']})" if r.get("peak_pipeline_rank") is not None else ""),
    ]
    for k, v in r["memory_breakdown_gib"].items():
        lines.append(f"  {k:<30} {_gib(v)}")
    if r.get("memory_by_pipeline_rank_gib"):
        by_rank = " ".join(f"{v:.2f}" for v in r["memory_by_pipeline_rank_gib"])
        lines.append(f"  by pipeline rank: {by_rank} GiB (rank 0's is the peak a run logs)")
    lines += [
        "",
        f"step time  {r['step_time_s']:.3f} s"
        + (" (a lower bound: see 'not priced')" if "not_priced" in r else ""),
    ]
    for k, v in r["step_time_breakdown_s"].items():
        lines.append(f"  {k:<30} {v:9.3f} s")
    detail = ", ".join(f"{k} {v:.3f}" for k, v in r["compute_detail_s"].items())
    lines.append(f"  (compute = {detail})")
    tflops = r["tflops_per_device"]
    tflops_text = f"{tflops:.0f}" if tflops >= 10 else f"{tflops:.2g}"  # a CPU's 0.09 TFLOPS is not "0"
    lines += [
        "",
        f"tokens/s   {r['tokens_per_sec_per_device']:,.0f} per device, {r['tokens_per_sec_global']:,.0f} global",
        f"MFU        {r['mfu_percent']:.1f} % of the bf16 peak ({tflops_text} TFLOPS per device,"
        f" {r['flops_per_token']:,.0f} FLOPs/token)"
        + (f"; {r['mfu_percent_fp8_mixed']:.1f} % fp8-mixed" if "mfu_percent_fp8_mixed" in r else ""),
    ]
    for item in r.get("not_priced", []):
        lines.append(f"not priced {item}")
    if "gpu_hours" in r:
        lines.append(
            f"run        {r['total_tokens']:.3g} tokens: {r['gpu_hours']:,.0f} device-hours, {r['days']:.1f} days"
            f" on {hw['num_devices']} devices"
            + (f" at {r['goodput_percent']:g} % goodput" if r["goodput_percent"] < 100 else "")
        )
    return "\n".join(lines)


def inference_report(r: dict) -> str:
    lines = [
        f"generation batch {r['batch_size']}, prompt {r['prompt_len']}, {r['gen_len']} new tokens, weights"
        f" {r['weight_dtype']}, tp {r['tp']}",
        f"prefill    {r['prefill_ms']:.2f} ms"
        + (" (measured on this device)" if r.get("prefill_measured") else ""),
        f"decode     {r['decode_ms_per_token']:.3f} ms per token ("
        + (
            "measured on this device, carried to the model's depth"
            if r.get("decode_measured")
            else "memory-bandwidth bound"
            if r["bandwidth_bound"]
            else "compute bound"
        )
        + f"), {r['decode_tokens_per_sec']:,.1f} tokens/s while decoding",
        f"throughput {r['tokens_per_sec']:,.1f} tokens/s end to end",
        f"memory     {r['memory_gib']:.2f} GiB per device -> " + ("FITS" if r["fits"] else "DOES NOT FIT"),
    ]
    for k, v in r["memory_breakdown_gib"].items():
        lines.append(f"  {k:<30} {_gib(v)}")
    return "\n".join(lines)


def search_report(results: list[dict], top: int) -> str:
    from .search import layout_flags

    if not results:
        return "search: no layout fits (try more devices, a shorter seq_len, or float8/compile)"
    # "at risk": of the comparable published runs' memory errors, how many would make this layout not fit
    # (accuracy.py, verdict_flipped_by); shown when the layouts carry their validation entry
    risk = [r.get("validation", {}).get("memory GiB", {}) for r in results[:top]]
    show_risk = any("verdict_flipped_by" in a for a in risk)
    head = (
        f"{'#':>3} {'tok/s/dev':>10} {'MFU%':>6} {'mem GiB':>8} {'step s':>8}"
        + (f" {'at risk':>8}" if show_risk else "")
        + "  layout"
    )
    lines = [f"search: {len(results)} layouts fit; the {min(top, len(results))} fastest:", head]
    for i, (r, a) in enumerate(zip(results[:top], risk), 1):
        lay = r["layout"]
        desc = (
            f"dp_rep {lay['dp_replicate']} x shard {lay['dp_shard']} x cp {lay['cp']} x tp {lay['tp']} x pp {lay['pp']}"
            + (f" {lay['pp_schedule']}" if lay["pp"] > 1 else "")
            + f", AC {lay['ac_mode']}, local batch {lay['local_batch_size']}"
        )
        at_risk = f"{a['verdict_flipped_by']}/{a['figures']}" if "verdict_flipped_by" in a else "-"
        lines.append(
            f"{i:>3} {r['tokens_per_sec_per_device']:>10,.0f} {r['mfu_percent']:>6.1f} {r['memory_gib']:>8.1f}"
            f" {r['step_time_s']:>8.3f}" + (f" {at_risk:>8}" if show_risk else "") + f"  {desc}"
        )
    if show_risk:
        lines.append(
            "at risk: of the comparable published runs, how many were estimated low by more than the layout's"
            " headroom (at their error it would not fit)"
        )
    lines.append(f"best: {layout_flags(results[0])}")
    return "\n".join(lines)
