/*
 * test_sample.c - standalone checks of the token sampler (rlx/sample.h): the greedy tie rule,
 * the counter-based generator, top_k / top_p / min_p keeping exactly the expected sets, the
 * repetition penalty, temperature, chunking invariance and the error statuses. It prints one line
 * per failed check and ends with "N passed, M failed"; it exits non-zero if anything failed.
 * It must never depend on anything but the public headers and the C library.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "rlx/sample.h"

#include "check.h"

#define MAXV 1024
static float scratch[MAXV];
static int32_t idx_buf[MAXV];

/* One draw; returns the token or -1000 + status on error. */
static int32_t draw(const float *logits, int64_t v, const struct rlx_sample_opts *o, const int32_t *hist,
                    int64_t n_hist, uint64_t i)
{
    int32_t tok = -1;
    rlx_status s = rlx_sample(logits, v, o, hist, n_hist, i, scratch, idx_buf, &tok);
    return s == RLX_OK ? tok : -1000 + s;
}

/* counts[t] = times token t came out of n draws at indices 0..n-1; returns false on any error. */
static bool histogram(const float *logits, int64_t v, const struct rlx_sample_opts *o, int n, int *counts)
{
    memset(counts, 0, sizeof(int) * (size_t)v);
    for (int i = 0; i < n; i++) {
        int32_t t = draw(logits, v, o, NULL, 0, (uint64_t)i);
        if (t < 0 || t >= v) return false;
        counts[t]++;
    }
    return true;
}

/* logits[i] = log(p[i]) */
static void log_probs(float *logits, const double *p, int v)
{
    for (int i = 0; i < v; i++) logits[i] = (float)log(p[i]);
}

/* A small deterministic stream of pseudo-random logits for property checks. */
static void random_logits(float *l, int v, uint64_t salt)
{
    for (int i = 0; i < v; i++) l[i] = (float)(rlx_rng_uniform(salt, (uint64_t)i) * 8.0 - 4.0);
}

static struct rlx_sample_opts sampling(float t)
{
    struct rlx_sample_opts o = rlx_sample_opts_greedy();
    o.temperature = t;
    o.seed = 1234;
    return o;
}

static void test_greedy(void)
{
    struct rlx_sample_opts g = rlx_sample_opts_greedy();
    CHECK(g.temperature == 0 && g.top_k == 0 && g.top_p == 1 && g.min_p == 0 && g.repetition_penalty == 1 &&
              g.seed == 0,
          "rlx_sample_opts_greedy defaults");
    float l[6] = {0.5f, 2.0f, -1.0f, 1.9f, 0.0f, -3.0f};
    CHECK(draw(l, 6, &g, NULL, 0, 0) == 1, "greedy argmax");
    float tie[5] = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f};
    CHECK(draw(tie, 5, &g, NULL, 0, 0) == 1, "greedy tie -> lowest id, got %d", draw(tie, 5, &g, NULL, 0, 0));
    float one[1] = {-7.0f};
    CHECK(draw(one, 1, &g, NULL, 0, 0) == 0, "vocab of 1");
    float copy[6];
    memcpy(copy, l, sizeof l);
    struct rlx_sample_opts s = sampling(1.0f);
    s.top_k = 3;
    s.top_p = 0.9f;
    s.min_p = 0.05f;
    s.repetition_penalty = 1.3f;
    int32_t hist[2] = {1, 3};
    draw(l, 6, &s, hist, 2, 5);
    CHECK(memcmp(copy, l, sizeof l) == 0, "logits not modified");
    float nan_mix[4] = {NAN, -INFINITY, 0.25f, NAN};
    CHECK(draw(nan_mix, 4, &g, NULL, 0, 0) == 2, "greedy skips NaN");
    CHECK(draw(nan_mix, 4, &s, NULL, 0, 0) == 2, "sampling with one finite logit");
    float pinf[4] = {1.0f, INFINITY, 5.0f, INFINITY};
    CHECK(draw(pinf, 4, &g, NULL, 0, 0) == 1, "greedy with +inf -> lowest +inf id");
    int counts[4];
    struct rlx_sample_opts t1 = sampling(1.0f);
    CHECK(histogram(pinf, 4, &t1, 400, counts) && counts[0] == 0 && counts[2] == 0 && counts[1] > 100 &&
              counts[3] > 100,
          "+inf logits share the mass: %d %d %d %d", counts[0], counts[1], counts[2], counts[3]);
}

/* Greedy over long rows (the fast path's 8 lanes and its tail) against the plain rule: the lowest
 * id of the largest non-NaN logit; ties and NaNs placed in every lane and in the tail. */
static void test_greedy_long(void)
{
    struct rlx_sample_opts g = rlx_sample_opts_greedy();
    float l[1003];
    int bad = 0;
    for (int v = 1; v <= 1003; v += 61) {
        for (uint64_t salt = 0; salt < 24; salt++) {
            random_logits(l, v, 100 + salt);
            for (int i = 0; i < v; i++) { /* coarse values: many exact ties */
                l[i] = floorf(l[i] * 2.0f);
                if (rlx_rng_uniform(salt, 5000 + (uint64_t)i) < 0.05) l[i] = NAN;
                if (salt % 4 == 1 && rlx_rng_uniform(salt, 9000 + (uint64_t)i) < 0.01) l[i] = INFINITY;
                if (salt % 4 == 2 && rlx_rng_uniform(salt, 9000 + (uint64_t)i) < 0.3) l[i] = -INFINITY;
            }
            int want = -1;
            for (int i = 0; i < v; i++)
                if (!isnan(l[i]) && (want < 0 || l[i] > l[want])) want = i;
            int finite = 0;
            for (int i = 0; i < v; i++) finite += isfinite(l[i]) ? 1 : 0;
            if (!finite) continue;
            int32_t hist[3] = {0, v / 2, v - 1};
            bad += draw(l, v, &g, NULL, 0, 0) != want;
            bad += draw(l, v, &g, hist, 3, 0) != want; /* penalty 1: history changes nothing */
        }
    }
    CHECK(bad == 0, "greedy over long rows matches the plain argmax (%d mismatches)", bad);
}

static void test_rng(void)
{
    CHECK(rlx_rng_uniform(7, 42) == rlx_rng_uniform(7, 42), "rng is a pure function");
    CHECK(rlx_rng_uniform(7, 42) != rlx_rng_uniform(8, 42), "rng depends on the seed");
    CHECK(rlx_rng_uniform(7, 42) != rlx_rng_uniform(7, 43), "rng depends on the index");
    CHECK(rlx_rng_uniform(7, 42) != rlx_rng_uniform(8, 41), "seed+index is not a plain sum");
    double sum = 0, lo = 1, hi = 0;
    int in_range = 1, low_half = 0;
    for (uint64_t i = 0; i < 10000; i++) {
        double u = rlx_rng_uniform(99, i);
        in_range &= u >= 0.0 && u < 1.0;
        sum += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
        low_half += u < 0.5;
    }
    CHECK(in_range, "rng in [0, 1)");
    CHECK(fabs(sum / 10000 - 0.5) < 0.01, "rng mean %f", sum / 10000);
    CHECK(lo < 0.001 && hi > 0.999, "rng covers [0, 1): min %g max %g", lo, hi);
    CHECK(low_half > 4800 && low_half < 5200, "rng halves %d", low_half);
    int deciles[10] = {0};
    for (uint64_t i = 0; i < 10000; i++) deciles[(int)(rlx_rng_uniform(3, i) * 10)]++;
    int ok = 1;
    for (int d = 0; d < 10; d++) ok &= deciles[d] > 880 && deciles[d] < 1120;
    CHECK(ok, "rng deciles roughly uniform");
    CHECK(rlx_sample_scratch_floats(1000) >= 1000, "scratch for 1000");
}

static void test_top_k(void)
{
    float l[40];
    int mismatches = 0;
    for (uint64_t trial = 0; trial < 200; trial++) {
        random_logits(l, 40, trial + 1);
        struct rlx_sample_opts g = rlx_sample_opts_greedy();
        struct rlx_sample_opts k1 = sampling(0.7f + (float)(trial % 5));
        k1.top_k = 1;
        k1.seed = trial;
        mismatches += draw(l, 40, &g, NULL, 0, 0) != draw(l, 40, &k1, NULL, 0, trial);
    }
    CHECK(mismatches == 0, "top_k = 1 equals greedy (%d mismatches)", mismatches);

    /* top_k = 5 of 40: only the 5 largest ever appear (and all of them do with a high temperature). */
    random_logits(l, 40, 777);
    int order[40];
    for (int i = 0; i < 40; i++) order[i] = i;
    for (int i = 0; i < 40; i++) /* selection sort, descending */
        for (int j = i + 1; j < 40; j++)
            if (l[order[j]] > l[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    bool top5[40] = {false};
    for (int i = 0; i < 5; i++) top5[order[i]] = true;
    struct rlx_sample_opts o = sampling(5.0f);
    o.top_k = 5;
    int counts[40];
    bool ok = histogram(l, 40, &o, 3000, counts);
    int outside = 0, seen = 0;
    for (int i = 0; i < 40; i++) {
        outside += !top5[i] && counts[i] > 0;
        seen += top5[i] && counts[i] > 0;
    }
    CHECK(ok && outside == 0 && seen == 5, "top_k = 5: %d outside the top 5, %d of 5 seen", outside, seen);
    o.top_k = 1000; /* larger than vocab = off */
    CHECK(histogram(l, 40, &o, 3000, counts), "top_k > vocab runs");

    /* Ties at the k-th boundary keep exactly k, preferring lower ids. */
    float tie[6] = {1.0f, 3.0f, 0.0f, 3.0f, 3.0f, 3.0f};
    struct rlx_sample_opts t = sampling(1.0f);
    t.top_k = 2;
    int c6[6];
    ok = histogram(tie, 6, &t, 2000, c6);
    CHECK(ok && c6[1] > 800 && c6[3] > 800 && c6[0] + c6[2] + c6[4] + c6[5] == 0,
          "top_k tie keeps ids 1 and 3: %d %d %d %d %d %d", c6[0], c6[1], c6[2], c6[3], c6[4], c6[5]);
}

/* Draws n tokens and checks that exactly the tokens in `want` (a bitmask over 5) appear. */
static void expect_set(const float *l, const struct rlx_sample_opts *o, unsigned want, const char *what)
{
    int counts[5];
    bool ok = histogram(l, 5, o, 3000, counts);
    unsigned got = 0;
    for (int i = 0; i < 5; i++) got |= counts[i] > 0 ? 1u << i : 0;
    CHECK(ok && got == want, "%s: kept set 0x%x, want 0x%x", what, got, want);
}

static void test_top_p_min_p(void)
{
    /* probabilities in descending order: id1 .40, id3 .30, id4 .15, id0 .10, id2 .05 */
    const double p[5] = {0.10, 0.40, 0.05, 0.30, 0.15};
    float l[5];
    log_probs(l, p, 5);
    struct rlx_sample_opts o = sampling(1.0f);
    o.top_p = 0.6f;
    expect_set(l, &o, 1u << 1 | 1u << 3, "top_p 0.6");
    o.top_p = 0.8f;
    expect_set(l, &o, 1u << 1 | 1u << 3 | 1u << 4, "top_p 0.8");
    o.top_p = 0.9f;
    expect_set(l, &o, 0x1f & ~(1u << 2), "top_p 0.9");
    o.top_p = 0.01f;
    expect_set(l, &o, 1u << 1, "top_p 0.01 keeps the top token");
    o.top_p = 1.0f;
    expect_set(l, &o, 0x1f, "top_p 1 keeps everything");

    o = sampling(1.0f);
    o.min_p = 0.5f; /* keep p >= 0.20 */
    expect_set(l, &o, 1u << 1 | 1u << 3, "min_p 0.5");
    o.min_p = 0.3f; /* keep p >= 0.12 */
    expect_set(l, &o, 1u << 1 | 1u << 3 | 1u << 4, "min_p 0.3");
    o.min_p = 1.0f;
    expect_set(l, &o, 1u << 1, "min_p 1 keeps the top token");

    /* top_p then min_p: top_p 0.9 keeps {1,3,4,0}; min_p 0.3 then drops id0 (0.10 < 0.12). */
    o.top_p = 0.9f;
    o.min_p = 0.3f;
    expect_set(l, &o, 1u << 1 | 1u << 3 | 1u << 4, "top_p 0.9 + min_p 0.3");

    /* top_k before softmax: top_k 2 then top_p 0.5 over the renormalised pair (.4/.7 = .57) keeps id1. */
    o = sampling(1.0f);
    o.top_k = 2;
    o.top_p = 0.5f;
    expect_set(l, &o, 1u << 1, "top_k 2 + top_p 0.5");

    /* Frequencies follow the renormalised kept probabilities: top_p 0.8 -> .4/.85, .3/.85, .15/.85 */
    o = sampling(1.0f);
    o.top_p = 0.8f;
    int counts[5];
    bool ok = histogram(l, 5, &o, 20000, counts);
    double f1 = counts[1] / 20000.0, f3 = counts[3] / 20000.0, f4 = counts[4] / 20000.0;
    CHECK(ok && fabs(f1 - 0.4 / 0.85) < 0.02 && fabs(f3 - 0.3 / 0.85) < 0.02 && fabs(f4 - 0.15 / 0.85) < 0.02,
          "renormalised frequencies %f %f %f", f1, f3, f4);
    o.top_p = 1.0f;
    ok = histogram(l, 5, &o, 20000, counts);
    int close = ok;
    for (int i = 0; i < 5; i++) close &= fabs(counts[i] / 20000.0 - p[i]) < 0.015;
    CHECK(close, "plain softmax frequencies");
}

static void test_penalty(void)
{
    struct rlx_sample_opts g = rlx_sample_opts_greedy();
    float l[4] = {2.0f, 1.5f, -1.0f, -1.2f};
    int32_t h[3] = {0, 0, 0};
    CHECK(draw(l, 4, &g, h, 3, 0) == 0, "no penalty -> 0");
    g.repetition_penalty = 1.5f; /* 2 / 1.5 = 1.33 < 1.5 */
    CHECK(draw(l, 4, &g, h, 3, 0) == 1, "penalty 1.5 moves argmax to 1");
    g.repetition_penalty = 1.2f; /* once: 1.67 > 1.5; three times would be 1.16 < 1.5 */
    CHECK(draw(l, 4, &g, h, 3, 0) == 0, "penalty applied once per distinct id");
    float neg[2] = {-1.0f, -1.2f};
    int32_t h0[1] = {0};
    g.repetition_penalty = 1.5f; /* -1 * 1.5 = -1.5 < -1.2 */
    CHECK(draw(neg, 2, &g, h0, 1, 0) == 1, "negative logit multiplied by the penalty");
    g.repetition_penalty = 0.5f; /* r < 1 rewards: 1.5 / 0.5 = 3 > 2 */
    int32_t h1[1] = {1};
    CHECK(draw(l, 4, &g, h1, 1, 0) == 1, "penalty < 1 raises a positive logit");
    struct rlx_sample_opts k1 = sampling(1.0f);
    k1.top_k = 1;
    k1.repetition_penalty = 1.5f;
    CHECK(draw(l, 4, &k1, h, 3, 0) == 1, "penalty applies before sampling too");
    float big[2] = {3e38f, -3e38f};
    int32_t hb[2] = {0, 1};
    struct rlx_sample_opts s = sampling(1.0f);
    s.repetition_penalty = 0.01f;
    int32_t t = draw(big, 2, &s, hb, 2, 0);
    CHECK(t == 0, "penalty overflow stays finite, got %d", t);
}

static void test_temperature(void)
{
    float l[5] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f};
    int counts[5];
    struct rlx_sample_opts o = sampling(1000.0f);
    bool ok = histogram(l, 5, &o, 5000, counts);
    int spread = ok;
    for (int i = 0; i < 5; i++) spread &= counts[i] > 850 && counts[i] < 1150;
    CHECK(spread, "high temperature ~uniform: %d %d %d %d %d", counts[0], counts[1], counts[2], counts[3], counts[4]);
    o = sampling(0.01f);
    ok = histogram(l, 5, &o, 2000, counts);
    CHECK(ok && counts[4] == 2000, "low temperature -> argmax only (%d)", counts[4]);
    o = sampling(1e-30f);
    ok = histogram(l, 5, &o, 200, counts);
    CHECK(ok && counts[4] == 200, "tiny temperature does not overflow (%d)", counts[4]);
}

static void test_chunking(void)
{
    float l[40];
    random_logits(l, 40, 31337);
    struct rlx_sample_opts o = sampling(1.3f);
    o.top_k = 20;
    o.top_p = 0.95f;
    o.seed = 2024;
    int32_t one_pass[100];
    for (int i = 0; i < 100; i++) one_pass[i] = draw(l, 40, &o, NULL, 0, (uint64_t)i);
    int same = 1;
    /* in reverse, and in chunks of 7 interleaved with unrelated draws */
    for (int i = 99; i >= 0; i--) same &= draw(l, 40, &o, NULL, 0, (uint64_t)i) == one_pass[i];
    for (int c = 0; c < 100; c += 7) {
        struct rlx_sample_opts other = o;
        other.seed = 5;
        draw(l, 40, &other, NULL, 0, (uint64_t)c);
        for (int i = c; i < c + 7 && i < 100; i++) same &= draw(l, 40, &o, NULL, 0, (uint64_t)i) == one_pass[i];
    }
    CHECK(same, "token i depends only on (seed, i, logits)");
    int differ = 0;
    struct rlx_sample_opts o2 = o;
    o2.seed = 2025;
    for (int i = 0; i < 100; i++) differ += draw(l, 40, &o2, NULL, 0, (uint64_t)i) != one_pass[i];
    CHECK(differ > 20, "another seed gives other tokens (%d differ)", differ);
}

static void test_errors(void)
{
    struct rlx_sample_opts good = sampling(1.0f);
    CHECK(rlx_sample_opts_check(&good) == RLX_OK, "good options accepted");
    struct {
        const char *field;
        struct rlx_sample_opts o;
    } bad[10];
    for (int i = 0; i < 10; i++) bad[i].o = good;
    bad[0].field = "temperature", bad[0].o.temperature = -0.5f;
    bad[1].field = "temperature", bad[1].o.temperature = NAN;
    bad[2].field = "top_k", bad[2].o.top_k = -1;
    bad[3].field = "top_p", bad[3].o.top_p = 1.5f;
    bad[4].field = "top_p", bad[4].o.top_p = 0.0f;
    bad[5].field = "min_p", bad[5].o.min_p = -0.1f;
    bad[6].field = "min_p", bad[6].o.min_p = 1.01f;
    bad[7].field = "repetition_penalty", bad[7].o.repetition_penalty = 0.0f;
    bad[8].field = "repetition_penalty", bad[8].o.repetition_penalty = INFINITY;
    bad[9].field = "top_p", bad[9].o.top_p = NAN;
    float l[3] = {1, 2, 3};
    for (int i = 0; i < 10; i++) {
        rlx_status s = rlx_sample_opts_check(&bad[i].o);
        CHECK(s == RLX_ERR_INVALID && strstr(rlx_last_error(), bad[i].field) != NULL,
              "bad %s rejected (status %d, message \"%s\")", bad[i].field, s, rlx_last_error());
        int32_t tok = 77;
        s = rlx_sample(l, 3, &bad[i].o, NULL, 0, 0, scratch, idx_buf, &tok);
        CHECK(s == RLX_ERR_INVALID && tok == 77, "rlx_sample rejects bad %s, out untouched", bad[i].field);
    }
    bad[3].o.top_p = 1.5f;
    rlx_sample_opts_check(&bad[3].o);
    CHECK(strstr(rlx_last_error(), "1.5") != NULL, "message names the value: \"%s\"", rlx_last_error());

    int32_t tok = 77;
    float nan3[3] = {NAN, NAN, NAN};
    rlx_status s = rlx_sample(nan3, 3, &good, NULL, 0, 0, scratch, idx_buf, &tok);
    CHECK(s == RLX_ERR_RANGE && tok == 77 && rlx_last_error()[0] != '\0', "all-NaN -> RLX_ERR_RANGE (%d)", s);
    struct rlx_sample_opts g = rlx_sample_opts_greedy();
    s = rlx_sample(nan3, 3, &g, NULL, 0, 0, scratch, idx_buf, &tok);
    CHECK(s == RLX_ERR_RANGE && tok == 77, "all-NaN greedy -> RLX_ERR_RANGE (%d)", s);
    float inf3[3] = {-INFINITY, NAN, INFINITY};
    s = rlx_sample(inf3, 2, &good, NULL, 0, 0, scratch, idx_buf, &tok);
    CHECK(s == RLX_ERR_RANGE, "all non-finite -> RLX_ERR_RANGE (%d)", s);
    s = rlx_sample(l, 0, &good, NULL, 0, 0, scratch, idx_buf, &tok);
    CHECK(s == RLX_ERR_INVALID && tok == 77, "vocab 0 rejected (%d)", s);
    int32_t h[2] = {1, 3};
    s = rlx_sample(l, 3, &good, h, 2, 0, scratch, idx_buf, &tok);
    CHECK(s == RLX_ERR_RANGE && tok == 77, "history id outside vocab -> RLX_ERR_RANGE (%d)", s);
    s = rlx_sample(l, 3, &good, NULL, 2, 0, scratch, idx_buf, &tok);
    CHECK(s == RLX_ERR_INVALID, "NULL history with n_hist > 0 rejected (%d)", s);
    s = rlx_sample(l, 3, &good, NULL, 0, 0, NULL, idx_buf, &tok);
    CHECK(s == RLX_ERR_INVALID, "NULL scratch rejected (%d)", s);
    s = rlx_sample(l, 3, NULL, NULL, 0, 0, scratch, idx_buf, &tok);
    CHECK(s == RLX_ERR_INVALID, "NULL options rejected (%d)", s);
}

int main(void)
{
    test_greedy();
    test_greedy_long();
    test_rng();
    test_top_k();
    test_top_p_min_p();
    test_penalty();
    test_temperature();
    test_chunking();
    test_errors();
    return check_summary();
}
