"""Formatting shared by benches/report.py and its gradient section (benches/report_grad.py)."""


def yes_no(v):
    return "unknown" if v is None else "yes" if v else "no"


def host_text(host):
    simd = host.get("simd", {})
    return (f"{host.get('cpu_model', 'unknown')} ({host.get('arch', '?')}), {host.get('cpus_online', '?')} CPUs"
            f" online; AVX2 {yes_no(simd.get('avx2'))}, FMA {yes_no(simd.get('fma'))},"
            f" AVX-512F {yes_no(simd.get('avx512f'))}")


def fmt_time(us):
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"
