/*
 * What the C benchmark drivers in benches/ share, so that every side of a ratio is timed and
 * described the same way:
 *
 *   timing   Config (time budget per case), Stats, measure(): warm-up, then timed samples of a
 *            body (repeated `inner` times per sample when one run is under 0.5 ms); median,
 *            min/max and p10/p90 in seconds per unit
 *   host     HostInfo: the CPU model, architecture, online CPUs and whether the CPU has AVX2,
 *            FMA and AVX-512F (from /proc/cpuinfo; "unknown" where it is absent); the 1-minute
 *            load average (/proc/loadavg)
 *   JSON     json_string, host_json
 *   records  Record, add_record (printed as they come), write_records (the JSON array)
 *
 * Header-only (static functions) for one-file C11 or C++17 programs; needs mlxk_test_util.h
 * (clock, xmalloc) included first, in C _POSIX_C_SOURCE 200809L, and -lm.
 */

#ifndef MLXKERN_BENCH_HARNESS_H
#define MLXKERN_BENCH_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "mlxk_test_util.h"

/* ---------------------------------------------------------------------------------------- */
/* Timing                                                                                   */

typedef struct {
    double budget_s;   /* target time of the timed samples of one case */
    double max_case_s; /* never spend more than this on one case's timed samples */
    int min_reps;
    int max_reps;
    int quick;
} Config;

static Config cfg;

/* MLXK_BENCH_QUICK=1 (any value but "" and "0"): the short run's budget. */
static void config_from_env(void) {
    const char *quick = getenv("MLXK_BENCH_QUICK");
    int q = quick != NULL && quick[0] != '\0' && strcmp(quick, "0") != 0;
    const Config quick_cfg = {0.25, 0.8, 2, 30, 1};
    const Config full_cfg = {1.0, 3.0, 3, 200, 0};
    cfg = q ? quick_cfg : full_cfg;
}

typedef struct {
    int n;          /* timed samples */
    int inner;      /* bodies per sample */
    double median;  /* seconds per unit */
    double min, max, p10, p90;
} Stats;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile_sorted(const double *v, int n, double q) {
    if (n == 1) {
        return v[0];
    }
    double pos = q * (double)(n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    double frac = pos - (double)lo;
    return v[lo] * (1.0 - frac) + v[hi] * frac;
}

typedef void (*Body)(void *ctx);

/* Runs `body` (warm-up, then timed samples). `units` is how many units (steps, calls) one
 * body covers; the statistics are seconds per unit. Fast bodies are repeated `inner` times
 * per sample so that each sample lasts at least ~0.5 ms. */
static Stats measure(Body body, void *ctx, double units) {
    double t0 = mlxkt_now_seconds();
    body(ctx);
    double t_one = mlxkt_now_seconds() - t0;
    if (t_one < 0.05) { /* a few more warm-up runs for cheap bodies */
        int extra = t_one < 0.005 ? 5 : 2;
        t0 = mlxkt_now_seconds();
        for (int i = 0; i < extra; i++) {
            body(ctx);
        }
        t_one = (mlxkt_now_seconds() - t0) / extra;
    }
    int inner = 1;
    if (t_one < 5e-4) {
        inner = (int)ceil(5e-4 / (t_one > 1e-8 ? t_one : 1e-8));
    }
    double t_sample = t_one * inner;
    int reps = (int)(cfg.budget_s / t_sample);
    if (reps < cfg.min_reps) {
        reps = cfg.min_reps;
    }
    if (reps > cfg.max_reps) {
        reps = cfg.max_reps;
    }
    if (reps * t_sample > cfg.max_case_s) {
        reps = (int)(cfg.max_case_s / t_sample);
        if (reps < 1) {
            reps = 1;
        }
    }
    double *samples = (double *)mlxkt_xmalloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        double s0 = mlxkt_now_seconds();
        for (int i = 0; i < inner; i++) {
            body(ctx);
        }
        samples[r] = (mlxkt_now_seconds() - s0) / ((double)inner * units);
    }
    qsort(samples, (size_t)reps, sizeof(double), cmp_double);
    Stats st;
    st.n = reps;
    st.inner = inner;
    st.median = quantile_sorted(samples, reps, 0.5);
    st.min = samples[0];
    st.max = samples[reps - 1];
    st.p10 = quantile_sorted(samples, reps, 0.1);
    st.p90 = quantile_sorted(samples, reps, 0.9);
    free(samples);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* JSON                                                                                     */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') {
            fputc('\\', f);
            fputc(*s, f);
        } else if ((unsigned char)*s < 0x20) {
            fprintf(f, "\\u%04x", (unsigned)(unsigned char)*s);
        } else {
            fputc(*s, f);
        }
    }
    fputc('"', f);
}

/* ---------------------------------------------------------------------------------------- */
/* Host                                                                                     */

/* The first three fields of /proc/loadavg as a JSON list, or "null" (other work on the
 * machine skews every figure). */
static void read_loadavg(char *dst, size_t len) {
    snprintf(dst, len, "null");
    FILE *f = fopen("/proc/loadavg", "r");
    if (f == NULL) {
        return;
    }
    double l1, l5, l15;
    if (fscanf(f, "%lf %lf %lf", &l1, &l5, &l15) == 3) {
        snprintf(dst, len, "[%.2f, %.2f, %.2f]", l1, l5, l15);
    }
    fclose(f);
}

enum { FLAG_UNKNOWN = -1 };

typedef struct {
    char cpu_model[160];
    char arch[72];
    long cpus_online;
    int avx2, fma, avx512f; /* 1 present, 0 absent, FLAG_UNKNOWN (no x86 flags list) */
} HostInfo;

/* Whether the space-separated list `flags` holds the word `name`. */
static int has_word(const char *flags, const char *name) {
    size_t n = strlen(name);
    for (const char *p = flags; (p = strstr(p, name)) != NULL; p += n) {
        int starts = p == flags || p[-1] == ' ' || p[-1] == '\t';
        int ends = p[n] == '\0' || p[n] == ' ' || p[n] == '\n' || p[n] == '\t';
        if (starts && ends) {
            return 1;
        }
    }
    return 0;
}

/* The value of a "key<tabs>: value" line of /proc/cpuinfo, newline stripped. */
static const char *cpuinfo_value(char *line, const char *key) {
    size_t n = strlen(key);
    if (strncmp(line, key, n) != 0 || (line[n] != '\t' && line[n] != ' ' && line[n] != ':')) {
        return NULL;
    }
    char *colon = strchr(line, ':');
    if (colon == NULL) {
        return NULL;
    }
    char *v = colon + 1;
    while (*v == ' ') {
        v++;
    }
    v[strcspn(v, "\n")] = '\0';
    return v;
}

static HostInfo host_info(void) {
    HostInfo h;
    memset(&h, 0, sizeof h);
    snprintf(h.cpu_model, sizeof h.cpu_model, "unknown");
    h.cpus_online = sysconf(_SC_NPROCESSORS_ONLN);
    h.avx2 = h.fma = h.avx512f = FLAG_UNKNOWN;
    struct utsname u;
    snprintf(h.arch, sizeof h.arch, "%s", uname(&u) == 0 ? u.machine : "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL) {
        return h;
    }
    /* The lines run to a few kB (x86 flags): read them whole. */
    size_t cap = 16384;
    char *line = (char *)mlxkt_xmalloc(cap);
    int have_model = 0, have_flags = 0;
    while (fgets(line, (int)cap, f) != NULL && !(have_model && have_flags)) {
        const char *v;
        if (!have_model && ((v = cpuinfo_value(line, "model name")) != NULL ||
                            (v = cpuinfo_value(line, "Model Name")) != NULL)) {
            snprintf(h.cpu_model, sizeof h.cpu_model, "%s", v);
            have_model = 1;
        } else if (!have_flags && (v = cpuinfo_value(line, "flags")) != NULL) {
            h.avx2 = has_word(v, "avx2");
            h.fma = has_word(v, "fma");
            h.avx512f = has_word(v, "avx512f");
            have_flags = 1;
        }
    }
    free(line);
    fclose(f);
    return h;
}

static const char *flag_word(int flag) {
    return flag == FLAG_UNKNOWN ? "unknown" : flag ? "yes" : "no";
}

static const char *flag_json(int flag) {
    return flag == FLAG_UNKNOWN ? "null" : flag ? "true" : "false";
}

/* One line: "Intel(R) Xeon(R) Processor (x86_64), 2 CPUs online; AVX2 yes, FMA yes, AVX-512F yes". */
static void host_line(const HostInfo *h, char *dst, size_t len) {
    snprintf(dst, len, "%s (%s), %ld CPUs online; AVX2 %s, FMA %s, AVX-512F %s", h->cpu_model, h->arch,
             h->cpus_online, flag_word(h->avx2), flag_word(h->fma), flag_word(h->avx512f));
}

/* "host": {...} (no trailing comma or newline). */
static void host_json(FILE *f, const HostInfo *h) {
    fprintf(f, "\"host\": {\"cpu_model\": ");
    json_string(f, h->cpu_model);
    fprintf(f, ", \"arch\": ");
    json_string(f, h->arch);
    fprintf(f, ", \"cpus_online\": %ld, \"simd\": {\"avx2\": %s, \"fma\": %s, \"avx512f\": %s}}",
            h->cpus_online, flag_json(h->avx2), flag_json(h->fma), flag_json(h->avx512f));
}

/* ---------------------------------------------------------------------------------------- */
/* Records: one per case and implementation, printed as they come, written to JSON at the end */

#ifndef MAX_RECORDS
#define MAX_RECORDS 256
#endif

typedef struct {
    char id[80];
    char op[40];
    char impl[16];   /* "mlxkern", "llama_cpp", "memcpy", "memcpy_2t", "rmw_2t" */
    char unit[24];   /* what one unit is: "layer-step", "call" */
    char note[320];
    int batch;
    int tokens_t;    /* T (tokens per row) or S (rows of the head split / gated norm) */
    double tokens;   /* tokens processed per unit (real tokens, masked ones excluded) */
    double bytes;    /* baselines: bytes read + written per unit; 0 otherwise */
    Stats st;
} Record;

static Record records[MAX_RECORDS];
static int n_records;

static void add_record(const char *id, const char *op, const char *impl, const char *unit,
                       int batch, int tokens_t, double tokens, double bytes, Stats st,
                       const char *note) {
    if (n_records == MAX_RECORDS) {
        fprintf(stderr, "bench: too many records\n");
        exit(1);
    }
    Record *r = &records[n_records++];
    memset(r, 0, sizeof *r);
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->op, sizeof r->op, "%s", op);
    snprintf(r->impl, sizeof r->impl, "%s", impl);
    snprintf(r->unit, sizeof r->unit, "%s", unit);
    snprintf(r->note, sizeof r->note, "%s", note ? note : "");
    r->batch = batch;
    r->tokens_t = tokens_t;
    r->tokens = tokens;
    r->bytes = bytes;
    r->st = st;
    double tps = tokens > 0 ? tokens / st.median : 0.0;
    printf("  %-34s %-9s %11.1f us/%-10s [p10 %9.1f  p90 %9.1f  n %3d x%d]", id, impl,
           st.median * 1e6, unit, st.p10 * 1e6, st.p90 * 1e6, st.n, st.inner);
    if (tps > 0) {
        printf("  %10.0f tok/s", tps);
    }
    if (bytes > 0) {
        printf("  %6.2f GB/s", bytes / st.median * 1e-9);
    }
    printf("\n");
    fflush(stdout);
}

/* The records as a JSON array (one object per line); `extra` (e.g. `, "threads": 2`, or "")
 * goes into every object before its note. */
static void write_records(FILE *f, const char *extra) {
    fprintf(f, "[\n");
    for (int i = 0; i < n_records; i++) {
        const Record *r = &records[i];
        fprintf(f, "    {\"id\": ");
        json_string(f, r->id);
        fprintf(f, ", \"op\": ");
        json_string(f, r->op);
        fprintf(f, ", \"impl\": ");
        json_string(f, r->impl);
        fprintf(f, ", \"unit\": ");
        json_string(f, r->unit);
        fprintf(f, ", \"B\": %d, \"T\": %d, \"tokens_per_unit\": %.6g, \"bytes_per_unit\": %.6g",
                r->batch, r->tokens_t, r->tokens, r->bytes);
        fprintf(f, ", \"n\": %d, \"inner\": %d, \"median_us\": %.4f, \"min_us\": %.4f, \"max_us\": %.4f"
                   ", \"p10_us\": %.4f, \"p90_us\": %.4f",
                r->st.n, r->st.inner, r->st.median * 1e6, r->st.min * 1e6, r->st.max * 1e6,
                r->st.p10 * 1e6, r->st.p90 * 1e6);
        fprintf(f, ", \"tokens_per_s\": %.6g%s", r->tokens > 0 ? r->tokens / r->st.median : 0.0,
                extra);
        fprintf(f, ", \"note\": ");
        json_string(f, r->note);
        fprintf(f, "}%s\n", i + 1 < n_records ? "," : "");
    }
    fprintf(f, "  ]");
}

#endif /* MLXKERN_BENCH_HARNESS_H */
