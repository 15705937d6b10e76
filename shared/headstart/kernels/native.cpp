// headstart's native kernels for forwards of a few tokens (decode steps, typing rows):
// a linear layer (hs_linear_*), the rows' few new tokens' causal attention over their caches
// (hs_attend_batch) and the LM head's int8 screening pass (hs_screen_u8i8).
//
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]); x float32 [M, K], w float32 or
// bfloat16 [N, K] row-major (nn.Linear's layout), y float32 [M, N].
//
// Why it exists: at a few tokens a linear layer is bound by reading its
// weights once. MKL's float32 matrix-vector product reads ~21 GiB/s on the
// 2-core machines we measure on and llama.cpp's ~59 GiB/s; this kernel reads
// the weights the way llama.cpp's does (each output row a dot product
// streamed from memory, threads splitting the rows) and reuses every weight
// vector it loads for up to MTILE input rows.
//
// Exactness: the sum of every output element is taken in one fixed order
// (16-lane FMA accumulator over k, masked tail, then one horizontal add),
// whatever M, the tiling or the thread split: a token's result does not depend
// on the other tokens in the forward (batch invariance for free), and a lone
// decode step equals the same row inside a batch bit for bit.
//
// Built at first use by native_kernel.py with -O3 -march=native; OpenMP
// resolves to the libgomp that torch already loaded (same soname), so this
// kernel and torch's ops share one thread pool.
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <vector>
#include <immintrin.h>

#if !defined(__AVX512F__) || !defined(__FMA__)
#error "linear_small_m.cpp needs AVX-512F (native_kernel.py checks the CPU before building)"
#endif

namespace {

// A block is ROWS output rows whose weight vectors are loaded once per k step
// and used for MTILE input rows (ROWS * MTILE accumulators). Measured on a
// 2-core EPYC (a 0.5B model's matrices streamed from memory): one token reads
// fastest one row at a time (one stream per thread, as llama.cpp's vec_dot);
// more tokens, 8 rows x 4 or x 3 tokens. The block shape does not change any
// sum's order, so results do not depend on it.
// (Software prefetching 256 or 1024 floats ahead measured no faster.)
//
// PLAIN (float32 weights only): the weight vectors are read with plain loads,
// which the compiler folds into the FMAs as memory operands, instead of
// masked loads, which it keeps in registers. With 8 rows x 3-4 tokens the
// registers do not hold every weight vector and every accumulator, and the
// masked form spills: measured on the 0.5B's matrices (median of 7
// interleaved rounds, ms), 8 x 4 masked against plain: M=4 69 / 60, M=6 92 /
// 74, M=8 118 / 87, M=16 211 / 128. One row at a time (1 x M) is the other
// way round (M=4: 1 x 4 masked 66-70, plain 82-85), so it keeps the masked load.
// A plain load reads the same 16 floats: the sums are the same, bit for bit.

template <typename W>
inline __m512 load_w(const W* p, __mmask16 mask);

template <>
inline __m512 load_w<float>(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}

// bfloat16 -> float32 is exact: the 16 bits become the high half of a float.
template <>
inline __m512 load_w<uint16_t>(const uint16_t* p, __mmask16 mask) {
  __m256i half = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// A whole vector of 16 weights (the main loop): PLAIN as above.
template <typename W, bool PLAIN>
inline __m512 load_full(const W* p) {
  return load_w<W>(p, 0xFFFF);
}

template <>
inline __m512 load_full<float, true>(const float* p) {
  return _mm512_loadu_ps(p);
}

constexpr int PREFETCH_BYTES = 4096;

// y[m, n0 + j] for j < rows (<= ROWS) and m < mt (<= MTILE)
template <typename W, int ROWS, int MTILE, bool PLAIN>
inline void block(const W* w, int64_t K, const float* x, int mt, int rows, float* y, int64_t N,
                  const float* bias, int64_t n0) {
  __m512 acc[MTILE][ROWS];
  for (int m = 0; m < MTILE; ++m)
    for (int j = 0; j < ROWS; ++j) acc[m][j] = _mm512_setzero_ps();
  const W* wr[ROWS];
  for (int j = 0; j < ROWS; ++j) wr[j] = w + (n0 + (j < rows ? j : 0)) * K;  // a short block repeats row 0
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    // one stream per thread and a few tokens (ROWS == 1, MTILE > 1): fetch
    // 4 KiB ahead of it, so memory keeps streaming while their FMAs run
    // (measured: float32 2-4 tokens as fast as one, 40 ms against 57-58
    // without; one token no faster, so it is left as it was measured)
    if (ROWS == 1 && MTILE > 1) _mm_prefetch((const char*)(wr[0] + k) + PREFETCH_BYTES, _MM_HINT_T0);
    __m512 wv[ROWS];
    for (int j = 0; j < ROWS; ++j) wv[j] = load_full<W, PLAIN>(wr[j] + k);
    for (int m = 0; m < MTILE; ++m) {
      if (m >= mt) break;
      const __m512 xv = _mm512_loadu_ps(x + m * K + k);
      for (int j = 0; j < ROWS; ++j) acc[m][j] = _mm512_fmadd_ps(wv[j], xv, acc[m][j]);
    }
  }
  if (k < K) {
    const __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);
    __m512 wv[ROWS];
    for (int j = 0; j < ROWS; ++j) wv[j] = load_w<W>(wr[j] + k, mask);
    for (int m = 0; m < mt; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * K + k);
      for (int j = 0; j < ROWS; ++j) acc[m][j] = _mm512_fmadd_ps(wv[j], xv, acc[m][j]);
    }
  }
  for (int m = 0; m < mt; ++m)
    for (int j = 0; j < rows; ++j) {
      float s = _mm512_reduce_add_ps(acc[m][j]);
      if (bias) s += bias[n0 + j];
      y[m * N + n0 + j] = s;
    }
}

template <typename W, int ROWS, int MTILE, bool PLAIN = false>
void linear_blocks(const W* w, const float* x, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                   int threads) {
  const int64_t blocks = (N + ROWS - 1) / ROWS;
#pragma omp parallel num_threads(threads)
  {
    // contiguous ranges of blocks: each thread streams its own part of the matrix
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * ROWS;
      const int rows = (int)(N - n0 < ROWS ? N - n0 : ROWS);
      for (int64_t m0 = 0; m0 < M; m0 += MTILE) {
        const int mt = (int)(M - m0 < MTILE ? M - m0 : MTILE);
        block<W, ROWS, MTILE, PLAIN>(w, K, x + m0 * K, mt, rows, y + m0 * N, N, bias, n0);
      }
    }
  }
}

// Up to three tokens (float32; six for bfloat16) a thread streams one weight
// row at a time (prefetched ahead) and keeps one accumulator per token
// (1 x M); more tokens, 8 rows x 4 tokens, and past 8 tokens 8 x 3 (fewer
// accumulators, no spill; 24 tokens: 158 ms against 179). Measured on the
// 2-core EPYC, the 0.5B's layers and head, float32, median of 7 interleaved
// rounds (ms, this dispatch against the last one's): M=4 60 / 70, M=5 73 /
// 85, M=6 74 / 95, M=7 74 / 103, M=8 87 / 118, M=12 97 / 162, M=16 122 /
// 211; M=1-3 unchanged. bfloat16 (widened in the kernel, so no load to fold)
// as measured before: M=1 23, M=2 23 / 32, M=4 26 / 33, M=6 58 / 63 (1 x M
// against 8 x 4 masked). Several weight streams per thread cost more than
// they save until the tokens are many.
template <typename W>
void linear(const W* w, const float* x, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
            int threads) {
  constexpr bool f32 = sizeof(W) == sizeof(float);
  switch (M) {
    case 1: return linear_blocks<W, 1, 1>(w, x, bias, y, M, N, K, threads);
    case 2: return linear_blocks<W, 1, 2>(w, x, bias, y, M, N, K, threads);
    case 3: return linear_blocks<W, 1, 3>(w, x, bias, y, M, N, K, threads);
    default: break;
  }
  if constexpr (f32) {
    if (M <= 8) return linear_blocks<W, 8, 4, true>(w, x, bias, y, M, N, K, threads);
    return linear_blocks<W, 8, 3, true>(w, x, bias, y, M, N, K, threads);
  }
  switch (M) {
    case 4: return linear_blocks<W, 1, 4>(w, x, bias, y, M, N, K, threads);
    case 5:
    case 6: return linear_blocks<W, 1, 6>(w, x, bias, y, M, N, K, threads);
    default: return linear_blocks<W, 8, 4>(w, x, bias, y, M, N, K, threads);
  }
}

// ---- rows' new tokens' attention over their caches (decode steps, typing rows of a few tokens) ----
//
// q: float32, RoPE applied; each row's cache is a few pieces (a shared prefix,
// the row's own tail, its new tokens last). Scores, softmax and the weighted
// sum are float32, each in one fixed order (the pieces in turn, tokens in
// turn), whatever the threads or the other rows.
template <typename W>
void axpy(float a, const W* v, float* out, int dim) {
  const __m512 av = _mm512_set1_ps(a);
  int d = 0;
  for (; d + 16 <= dim; d += 16)
    _mm512_storeu_ps(out + d, _mm512_fmadd_ps(av, load_w<W>(v + d, 0xFFFF), _mm512_loadu_ps(out + d)));
  if (d < dim) {
    const __mmask16 mask = (__mmask16)((1u << (dim - d)) - 1u);
    _mm512_mask_storeu_ps(out + d, mask,
                          _mm512_fmadd_ps(av, load_w<W>(v + d, mask), _mm512_maskz_loadu_ps(mask, out + d)));
  }
}

// e^x for 16 floats x <= 0 (a softmax's scores less their maximum): x =
// n ln 2 + r with |r| <= ln 2 / 2 (ln 2 split in two parts, Cody-Waite), e^r
// by its degree-6 Taylor polynomial (Horner), times 2^n (scalef: 0 below
// -87.3 or so, as expf underflows). Within 3 ulp of expf on [-88, 0] (2 million
// values checked); 16 at a time instead of one libm call per key. A lane's
// result does not depend on the others.
inline __m512 exp16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// 16 vectors' horizontal sums as one vector: lane i is the sum of v[i]'s
// 16 lanes, always by the same tree (pairs within 128-bit lanes, then the
// four 128-bit lanes), whatever the other vectors hold: 45 shuffles and adds
// for 16 keys instead of a horizontal add each. With exp16 and the output
// held in registers (weighted_sum), the attention of 8 decode rows over
// 350-token caches took 0.26 ms a layer against 0.31 (one key at a time).
inline __m512 sum16(const __m512* v) {
  __m512 s[8], t[4];
  for (int i = 0; i < 8; ++i)
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(s[2 * i]), b = _mm512_castps_pd(s[2 * i + 1]);
    t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(t[2], t[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(t[2], t[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// scores[0..n) = (q . k_j) * scale for n <= 16 keys dim apart: each a 16-lane
// FMA accumulator over dim (masked tail), then sum16. A key's score does not
// depend on the keys beside it in the block (absent ones are zero vectors).
template <typename W>
inline void score_block(const float* q, const W* k, int n, int dim, float scale, float* scores) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    const __m512 qv = _mm512_loadu_ps(q + d);
    for (int j = 0; j < n; ++j) acc[j] = _mm512_fmadd_ps(qv, load_w<W>(k + j * (int64_t)dim + d, 0xFFFF), acc[j]);
  }
  if (d < dim) {
    const __mmask16 mask = (__mmask16)((1u << (dim - d)) - 1u);
    const __m512 qv = _mm512_maskz_loadu_ps(mask, q + d);
    for (int j = 0; j < n; ++j) acc[j] = _mm512_fmadd_ps(qv, load_w<W>(k + j * (int64_t)dim + d, mask), acc[j]);
  }
  _mm512_mask_storeu_ps(scores, (__mmask16)((1u << n) - 1u), _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
}

// out[0..dim) = sum_j weights[j] * v_j over n values dim apart, in j order
// (one FMA per value and element, from zero: the same sums as one axpy per
// value into memory), the output held in CH registers (dim = 16 * CH).
template <typename W, int CH>
inline void weighted_sum(const float* weights, const W* v, int64_t n, int dim, float* out) {
  __m512 acc[CH];
  for (int c = 0; c < CH; ++c) acc[c] = _mm512_loadu_ps(out + 16 * c);
  for (int64_t j = 0; j < n; ++j) {
    const __m512 a = _mm512_set1_ps(weights[j]);
    for (int c = 0; c < CH; ++c) acc[c] = _mm512_fmadd_ps(a, load_w<W>(v + j * dim + 16 * c, 0xFFFF), acc[c]);
  }
  for (int c = 0; c < CH; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}

// One query's attention (token t of its row, head h) over the row's cache
// pieces, of which it sees the first `visible` keys: scores, softmax and
// the weighted sum in float32, each in one fixed order (the pieces in turn,
// tokens in turn). `scores` holds at least `visible` floats.
template <typename W>
inline void attend_query(const float* qh, int64_t visible, int nseg, const void* const* keys,
                         const void* const* values, const int64_t* lengths, const int64_t* kstride,
                         const int64_t* vstride, int g, int dim, float scale, float* scores, float* oh) {
  int64_t at = 0;
  for (int s = 0; s < nseg && at < visible; ++s) {
    const W* k = (const W*)keys[s] + g * kstride[s];
    const int64_t len = lengths[s] < visible - at ? lengths[s] : visible - at;
    for (int64_t j = 0; j < len; j += 16)
      score_block<W>(qh, k + j * dim, (int)(len - j < 16 ? len - j : 16), dim, scale, scores + at + j);
    at += len;
  }
  float best = -INFINITY;
  for (int64_t j = 0; j < visible; ++j) best = scores[j] > best ? scores[j] : best;
  const __m512 top = _mm512_set1_ps(best);
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 mask = visible - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (visible - j)) - 1u);
    _mm512_mask_storeu_ps(scores + j, mask, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores + j), top)));
  }
  float sum = 0.f;
  for (int64_t j = 0; j < visible; ++j) sum += scores[j];
  for (int64_t j = 0; j < visible; ++j) scores[j] /= sum;
  for (int d = 0; d < dim; ++d) oh[d] = 0.f;
  at = 0;
  for (int s = 0; s < nseg && at < visible; ++s) {
    const W* v = (const W*)values[s] + g * vstride[s];
    const int64_t len = lengths[s] < visible - at ? lengths[s] : visible - at;
    if (dim == 64)
      weighted_sum<W, 4>(scores + at, v, len, dim, oh);
    else if (dim == 128)
      weighted_sum<W, 8>(scores + at, v, len, dim, oh);
    else
      for (int64_t j = 0; j < len; ++j) axpy<W>(scores[at + j], v + j * dim, oh, dim);
    at += len;
  }
}

// Attention of several rows' new tokens in one call (a batched forward's
// layer: every decode step and short typing row at once). Row r has nq[r]
// new tokens, packed one after another in q and out ([sum nq, heads, dim]),
// and nseg[r] cache pieces (a shared prefix, its own tail, its new tokens'
// keys last), listed row after row in keys/values/lengths/strides; piece s of
// a row holds lengths[s] tokens per kv head, kv head g at keys[s] + g *
// kstride[s] (and vstride[s]), tokens dim apart, float32 or bfloat16 (`bf16`).
// Token t of a row sees every cached key and its row's new keys up to itself
// (causal): the first total - (nq - 1 - t). Head h reads kv head h / (heads /
// kv_heads) (grouped-query attention). Every (token, head) is one query with
// its own fixed order (attend_query), so a row's output does not depend on
// the other rows in the call, nor on how many tokens share its row's call.
// One parallel region per call: before, one call per row cost a batched
// forward of 8 decode steps 192 thread-team starts per forward.
template <typename W>
void attend_batch(const float* q, int nrows, const int* nq, int heads, int kv_heads, int dim, float scale,
                  const int* nseg, const void* const* keys, const void* const* values, const int64_t* lengths,
                  const int64_t* kstride, const int64_t* vstride, float* out, int threads) {
  const int group = heads / kv_heads;
  std::vector<int> token_row, seg_first(nrows), token_first(nrows);
  std::vector<int64_t> row_total(nrows);
  int64_t longest = 0;
  for (int r = 0, seg = 0, tok = 0; r < nrows; ++r) {
    seg_first[r] = seg;
    token_first[r] = tok;
    int64_t total = 0;
    for (int s = 0; s < nseg[r]; ++s) total += lengths[seg + s];
    row_total[r] = total;
    longest = total > longest ? total : longest;
    seg += nseg[r];
    tok += nq[r];
    token_row.insert(token_row.end(), nq[r], r);
  }
  const int64_t items = (int64_t)token_row.size() * heads;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(longest > 0 ? longest : 1);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < items; ++i) {
      const int64_t token = i / heads;
      const int h = (int)(i % heads), r = token_row[token], sf = seg_first[r];
      const int64_t t = token - token_first[r];
      const int64_t visible = row_total[r] - (nq[r] - 1 - t);
      attend_query<W>(q + i * dim, visible, nseg[r], keys + sf, values + sf, lengths + sf, kstride + sf,
                      vstride + sf, h / group, dim, scale, scores.data(), out + i * dim);
    }
  }
}

// ---- the LM head's screening pass (screened_head.py): int8 weights, uint8 inputs ----
//
// y[m, n] = scale[n] * xscale[m] * sum_k q[n, k] * (xu[m, k] - 128), with q
// int8 [N, K] (one scale per weight row) and xu the input rows quantized to
// int8 and offset by 128 (uint8, one scale per row). The sum is an exact
// int32 (VNNI's dpbusd multiplies 64 unsigned by signed bytes into 16 int32
// lanes; the offset is taken off with qsum[n] = sum_k q[n, k]), so the only
// errors are the two quantizations and the final float products, which the
// caller bounds. A quarter of the float32 weight bytes (the 0.5B's 151936 x
// 896 head: 136 MB instead of 545) at a few instructions per 64 weights.
#if defined(__AVX512VNNI__)
constexpr bool kScreen = true;

void screen_u8i8(const int8_t* q, const int32_t* qsum, const float* scale, const uint8_t* xu, const float* xscale,
                 float* y, int64_t M, int64_t N, int64_t K, int threads) {
  constexpr int MT = 4;
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t n0 = N * t / nt, n1 = N * (t + 1) / nt;
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* row = q + n * K;
      for (int64_t m0 = 0; m0 < M; m0 += MT) {
        const int mt = (int)(M - m0 < MT ? M - m0 : MT);
        __m512i acc[MT];
        for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_si512();
        for (int64_t k = 0; k < K; k += 64) {
          const __mmask64 mask = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
          const __m512i w = _mm512_maskz_loadu_epi8(mask, row + k);
          for (int m = 0; m < mt; ++m)
            acc[m] = _mm512_dpbusd_epi32(acc[m], _mm512_maskz_loadu_epi8(mask, xu + (m0 + m) * K + k), w);
        }
        for (int m = 0; m < mt; ++m) {
          const int32_t dot = _mm512_reduce_add_epi32(acc[m]) - 128 * qsum[n];
          y[(m0 + m) * N + n] = (scale[n] * xscale[m0 + m]) * (float)dot;
        }
      }
    }
  }
}
#else
constexpr bool kScreen = false;

void screen_u8i8(const int8_t*, const int32_t*, const float*, const uint8_t*, const float*, float*, int64_t, int64_t,
                 int64_t, int) {}
#endif

}  // namespace

extern "C" {
// The ABI version native_kernel.py checks: bump it when a signature changes.
int hs_abi_version(void) { return 5; }

// The screen's candidates for one row: every n with est[n] + slack[n] >= max_u (est[u] - slack[u]), slack[n] =
// (a[n] * hnorm + b[n] * off) * (1 + 1e-9) + 1e-30 in float64 (screened_head.py: the bound and its margin). Writes
// up to `cap` indices in order to `out`; returns how many there are (more than cap: the caller runs the full head).
int64_t hs_screen_select(const float* est, const double* a, const double* b, double hnorm, double off, int64_t N,
                         int64_t* out, int64_t cap) {
  const auto slack = [&](int64_t n) { return (a[n] * hnorm + b[n] * off) * (1 + 1e-9) + 1e-30; };
  double floor = -INFINITY;
  for (int64_t n = 0; n < N; ++n) {
    const double low = (double)est[n] - slack(n);
    if (low > floor) floor = low;
  }
  int64_t count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if ((double)est[n] + slack(n) >= floor) {
      if (count < cap) out[count] = n;
      ++count;
    }
  }
  return count;
}

// 1 when this build has the screening pass (the CPU has AVX512-VNNI), else 0
int hs_screen_available(void) { return kScreen ? 1 : 0; }

void hs_screen_u8i8(const int8_t* q, const int32_t* qsum, const float* scale, const uint8_t* xu, const float* xscale,
                    float* y, int64_t M, int64_t N, int64_t K, int threads) {
  screen_u8i8(q, qsum, scale, xu, xscale, y, M, N, K, threads);
}

void hs_linear_f32(const float* w, const float* x, const float* bias, float* y, int64_t M, int64_t N,
                   int64_t K, int threads) {
  linear<float>(w, x, bias, y, M, N, K, threads);
}

void hs_linear_bf16(const uint16_t* w, const float* x, const float* bias, float* y, int64_t M, int64_t N,
                    int64_t K, int threads) {
  linear<uint16_t>(w, x, bias, y, M, N, K, threads);
}

void hs_attend_batch(const float* q, int nrows, const int* nq, int heads, int kv_heads, int dim, float scale,
                     const int* nseg, const void* const* keys, const void* const* values, const int64_t* lengths,
                     const int64_t* kstride, const int64_t* vstride, int bf16, float* out, int threads) {
  if (bf16)
    attend_batch<uint16_t>(q, nrows, nq, heads, kv_heads, dim, scale, nseg, keys, values, lengths, kstride,
                           vstride, out, threads);
  else
    attend_batch<float>(q, nrows, nq, heads, kv_heads, dim, scale, nseg, keys, values, lengths, kstride, vstride,
                        out, threads);
}
}
