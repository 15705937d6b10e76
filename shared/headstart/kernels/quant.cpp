// headstart's quantized kernels: the linear layers of a GGUF model served in its own
// integer formats (no float copy of the weights), and the rows' attention over their caches.
//
// Built once per instruction set (quant_kernel.py / cpu_isa.py): HS_ISA_AVX2 (AVX2 + FMA),
// HS_ISA_AVX512 (AVX-512 F/BW/VL/DQ) and HS_ISA_AVX512VNNI (with VNNI's dpbusd). Every build
// computes the same bits (below), so a test can run the AVX2 kernels on an AVX-512 machine and
// compare.
//
// ---- the linear layer ----
// y[m, n] = sum_k w[n, k] x[m, k] (+ bias[n]), with w stored as small unsigned integers in
// groups along k (gguf_formats.py): w = scale * (q - offset), or scale * q - min (4-bit).
// The activations are quantized per token in groups of 32 (int8, one float scale per group,
// as llama.cpp's Q8_0 activations are), so every group's dot product is an integer:
//
//   D[m, n, g] = sum_{k in g} q[n, k] * xq[m, k]                        (int32, exact)
//   y[m, n] = sum_g (D - offset[n] * xsum[m, g]) * (scale[n, g] * xs[m, g])   (float, g in order)
//
// The integer sums are exact whichever instructions make them (VNNI's dpbusd, or AVX2's
// maddubs + madd), and the float sum over groups is taken in one fixed order per output with
// the same fused multiply-adds on every instruction set: a token's result does not depend on
// the other tokens of the call (batch invariance) nor on the instruction set.
//
// Layout (quant_weights.py packs it once, at load): rows in blocks of 16; within a block, for
// each 4 consecutive k, the 16 rows' 4 bytes (64 bytes: one dpbusd, 16 rows' sums at once, no
// horizontal reduction). 4-bit blocks hold two such 64-byte chunks in one (low and high
// nibbles). Scales, minimums: [N/16][groups][16] floats; offsets [N/16][16] floats.
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <vector>
#include <immintrin.h>

#if defined(HS_ISA_AVX512VNNI)
#define HS_AVX512 1
#define HS_VNNI 1
#if !defined(__AVX512VNNI__)
#error "HS_ISA_AVX512VNNI needs -mavx512vnni"
#endif
#elif defined(HS_ISA_AVX512)
#define HS_AVX512 1
#elif defined(HS_ISA_AVX2)
#else
#error "define one of HS_ISA_AVX2, HS_ISA_AVX512, HS_ISA_AVX512VNNI"
#endif

#if defined(HS_AVX512) && !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__))
#error "the AVX-512 builds need -mavx512f -mavx512bw -mavx512vl"
#endif
#if !defined(__AVX2__) || !defined(__FMA__)
#error "every build needs -mavx2 -mfma"
#endif

namespace {

// ---- the kernels' own threads ----
// Each thread that calls the kernels gets its own helper threads (thread_local), started at its
// first parallel call. A parallel section publishes its task by bumping a generation counter; a
// helper spins on it (up to SPIN_US after its last task) before it sleeps on a condition variable.
// Why not OpenMP: a decode step runs ~5 parallel sections a layer (~120-140 a step), and libgomp,
// once the process holds more OpenMP threads than CPUs (torch's team on the main thread, ours on the
// forward worker), spins only 100 times before a futex sleep, so every section paid a wake-up (a
// call from a worker thread took 52 us against 29 us from the main thread, 2-core AMD EPYC Zen 3).
// The split of the work over threads never changes a result: every item is computed alone.
constexpr int SPIN_US = 2000;

class Pool {
 public:
  ~Pool() {
    if (state_ == nullptr || state_->pid != getpid()) return;  // a forked child does not own the helpers
    State& st = *state_;
    {
      std::lock_guard<std::mutex> lock(st.mutex);
      st.stop = true;
      st.generation.fetch_add(1, std::memory_order_release);
    }
    st.wake.notify_all();
    for (auto& t : st.helpers) t.join();
    delete state_;
  }

  // f(t, n) for t in [0, n): t = 0 on the calling thread, the others on helpers; returns when all did.
  void run(int n, const std::function<void(int, int)>& f) {
    if (n <= 1) {
      f(0, 1);
      return;
    }
    // after fork() the helpers are gone (only the forking thread is copied): start anew, and leave
    // the parent's state (its mutex may have been held at the fork) unreleased
    if (state_ == nullptr || state_->pid != getpid()) state_ = new State();
    State& st = *state_;
    while ((int)st.helpers.size() < n - 1) {
      const int index = (int)st.helpers.size() + 1;
      const uint64_t now = st.generation.load(std::memory_order_relaxed);
      st.helpers.emplace_back([&st, index, now] { helper(st, index, now); });
    }
    st.task = &f;
    st.threads = n;
    st.pending.store((int)st.helpers.size(), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(st.mutex);  // a helper between its check and its sleep holds it
      st.generation.fetch_add(1, std::memory_order_release);
    }
    st.wake.notify_all();
    f(0, n);
    while (st.pending.load(std::memory_order_acquire) != 0) _mm_pause();
  }

 private:
  struct State {
    pid_t pid = getpid();
    std::vector<std::thread> helpers;
    std::atomic<uint64_t> generation{0};
    std::atomic<int> pending{0};
    const std::function<void(int, int)>* task = nullptr;
    int threads = 1;
    bool stop = false;
    std::mutex mutex;
    std::condition_variable wake;
  };

  static void helper(State& st, int index, uint64_t seen) {
    for (;;) {
      if (!spin_until_new(st, seen)) {
        std::unique_lock<std::mutex> lock(st.mutex);
        st.wake.wait(lock, [&] { return st.generation.load(std::memory_order_acquire) != seen; });
      }
      seen = st.generation.load(std::memory_order_acquire);
      if (st.stop) return;
      if (index < st.threads) (*st.task)(index, st.threads);
      st.pending.fetch_sub(1, std::memory_order_release);
    }
  }

  static bool spin_until_new(const State& st, uint64_t seen) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(SPIN_US);
    for (;;) {
      for (int i = 0; i < 256; ++i) {
        if (st.generation.load(std::memory_order_acquire) != seen) return true;
        _mm_pause();
      }
      if (std::chrono::steady_clock::now() > until) return false;
    }
  }

  State* state_ = nullptr;
};

Pool& pool() {
  static thread_local Pool p;
  return p;
}

// f(i) for i in [0, items), in contiguous ranges over `threads` threads (one thread below `min_items`)
template <typename F>
void parallel_for(int64_t items, int threads, int64_t min_items, F f) {
  if (threads <= 1 || items < min_items || items < 2) {
    for (int64_t i = 0; i < items; ++i) f(i);
    return;
  }
  const int n = (int)(items < threads ? items : threads);
  pool().run(n, [&](int t, int nt) {
    const int64_t lo = items * t / nt, hi = items * (t + 1) / nt;
    for (int64_t i = lo; i < hi; ++i) f(i);
  });
}


// Weights are read as one sequential stream per thread; the hardware prefetcher alone kept a
// decode step under the memory's speed. Each unit asks for the lines HS_PREFETCH_BYTES ahead: one
// token's step, 2-core AMD EPYC Zen 3, AVX2, 8 alternated rounds: trained 1.5B 62.6 -> 51.7 ms,
// 0.5B 29.8 -> 26.2 ms (1024: -8%, 4096 and 8192: about as 2048). Results are unchanged.
#ifndef HS_PREFETCH_BYTES
#define HS_PREFETCH_BYTES 2048
#endif
constexpr int ROWS = 16;  // rows per block
constexpr int CHUNK = 64;  // bytes of one 4-k step of a block

// ---- 16 float lanes, one zmm or two ymm: the same lane-wise operations either way ----
#if defined(HS_AVX512)
struct V16 {
  __m512 v;
};
inline V16 vzero() { return {_mm512_setzero_ps()}; }
inline V16 vset1(float a) { return {_mm512_set1_ps(a)}; }
inline V16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void vstore(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
inline V16 vadd(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 vsub(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 vfnma(V16 a, V16 b, V16 c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
inline V16 vround(V16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V16 vabs(V16 a) { return {_mm512_abs_ps(a.v)}; }
inline V16 vmax(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V16 vmin(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V16 vdiv(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
// lanes where a < b hold 0, others a
inline V16 vzero_below(V16 a, V16 x, float limit) {
  return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x.v, _mm512_set1_ps(limit), _CMP_GE_OQ), a.v)};
}
inline V16 vpow2i(V16 n) {  // 2^n for integral n in [-126, 127]
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127)), 23);
  return {_mm512_castsi512_ps(e)};
}
inline __m256 vlo8(V16 a) { return _mm512_castps512_ps256(a.v); }
inline __m256 vhi8(V16 a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)); }
#else
struct V16 {
  __m256 lo, hi;
};
inline V16 vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 vset1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline V16 vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstore(float* p, V16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
#define HS_V2(op) {op(a.lo, b.lo), op(a.hi, b.hi)}
inline V16 vadd(V16 a, V16 b) { return HS_V2(_mm256_add_ps); }
inline V16 vsub(V16 a, V16 b) { return HS_V2(_mm256_sub_ps); }
inline V16 vmul(V16 a, V16 b) { return HS_V2(_mm256_mul_ps); }
inline V16 vmax(V16 a, V16 b) { return HS_V2(_mm256_max_ps); }
inline V16 vmin(V16 a, V16 b) { return HS_V2(_mm256_min_ps); }
inline V16 vdiv(V16 a, V16 b) { return HS_V2(_mm256_div_ps); }
#undef HS_V2
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 vfnma(V16 a, V16 b, V16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline V16 vround(V16 a) {
  return {_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline V16 vabs(V16 a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
inline V16 vzero_below(V16 a, V16 x, float limit) {
  const __m256 l = _mm256_set1_ps(limit);
  return {_mm256_and_ps(a.lo, _mm256_cmp_ps(x.lo, l, _CMP_GE_OQ)), _mm256_and_ps(a.hi, _mm256_cmp_ps(x.hi, l, _CMP_GE_OQ))};
}
inline V16 vpow2i(V16 n) {
  const __m256i b = _mm256_set1_epi32(127);
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.lo), b), 23)),
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.hi), b), 23))};
}
inline __m256 vlo8(V16 a) { return a.lo; }
inline __m256 vhi8(V16 a) { return a.hi; }
#endif

// The sum of 16 lanes by one fixed tree on every build: lane i + lane i+8, then + 4, + 2, + 1.
inline float vhsum(V16 a) {
  const __m256 s8 = _mm256_add_ps(vlo8(a), vhi8(a));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// e^x: x = n ln 2 + r, |r| <= ln 2 / 2 (Cody-Waite), e^r by its degree-6 Taylor polynomial,
// times 2^n; 0 below -87 (where expf leaves the normal floats), e^88 above 88. Within a few ulp
// of expf; the same operations on every build.
inline V16 vexp(V16 x) {
  x = vmin(x, vset1(88.f));  // e^88 < FLT_MAX: larger arguments give e^88, not inf
  const V16 n = vround(vmul(x, vset1(1.44269504088896341f)));
  V16 r = vfnma(n, vset1(0.693145751953125f), x);
  r = vfnma(n, vset1(1.428606765330187045e-06f), r);
  V16 p = vset1(1.f / 720.f);
  p = vfma(p, r, vset1(1.f / 120.f));
  p = vfma(p, r, vset1(1.f / 24.f));
  p = vfma(p, r, vset1(1.f / 6.f));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.f));
  p = vfma(p, r, vset1(1.f));
  return vzero_below(vmul(p, vpow2i(vmax(n, vset1(-126.f)))), x, -87.0f);
}

// ---- activations: per token, groups of 32, int8 ----
// xs = max|x| / 127; xq = x * (1 / xs) rounded to nearest even; xsum16 = sums of 16 xq (as floats,
// exact). A group of zeros gets xs = 0 and xq = 0.
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* xq, float* xs, float* xsum16, int threads) {
  const int64_t groups = K / 32, items = M * groups;
  parallel_for(items, threads, 512, [&](int64_t i) {
    const float* src = x + i * 32;  // rows are K apart and K = 32 * groups: item i is group i of the flat array
    const V16 a = vload(src), b = vload(src + 16);
    const V16 m = vmax(vabs(a), vabs(b));
    float amax = 0.f;
    float lanes[16];
    vstore(lanes, m);
    for (int l = 0; l < 16; ++l) amax = lanes[l] > amax ? lanes[l] : amax;
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    float qa[16], qb[16];
    vstore(qa, vround(vmul(a, vset1(id))));
    vstore(qb, vround(vmul(b, vset1(id))));
    int s0 = 0, s1 = 0;
    int8_t* dst = xq + i * 32;
    for (int l = 0; l < 16; ++l) {
      const int va = (int)qa[l], vb = (int)qb[l];
      dst[l] = (int8_t)va;
      dst[16 + l] = (int8_t)vb;
      s0 += va;
      s1 += vb;
    }
    xs[i] = d;
    xsum16[2 * i] = (float)s0;
    xsum16[2 * i + 1] = (float)s1;
  });
}

// ---- the integer dot products of one block's 16 rows with one token, over 4 (or 8) k ----
#if defined(HS_AVX512)
struct I16 {
  __m512i v;
};
inline I16 izero() { return {_mm512_setzero_si512()}; }
inline V16 icvt(I16 a) { return {_mm512_cvtepi32_ps(a.v)}; }
#else
struct I16 {
  __m256i lo, hi;
};
inline I16 izero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline V16 icvt(I16 a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
#endif

// acc += the 16 rows' sums of 4 products: w the chunk's 64 bytes (row r's 4 at 4r), x4 the
// token's 4 int8 as one int32. `wide`: bytes may exceed 128 (Q8_0's u = q + 128): the sign
// form is used where maddubs could saturate (AVX2, AVX-512 without VNNI), giving the sums of
// (u - 128) * x, which the caller does not correct.
#if defined(HS_VNNI)
template <bool WIDE>
inline void dot4(I16& acc, __m512i w, int32_t x4) {
  acc.v = _mm512_dpbusd_epi32(acc.v, w, _mm512_set1_epi32(x4));
}
#elif defined(HS_AVX512)
template <bool WIDE>
inline void dot4(I16& acc, __m512i w, int32_t x4) {
  const __m512i ones = _mm512_set1_epi16(1), x = _mm512_set1_epi32(x4);
  if (WIDE) {
    const __m512i s = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));  // q - 128 as int8
    const __mmask64 neg = _mm512_movepi8_mask(s);
    const __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);  // x * sign(s)
    acc.v = _mm512_add_epi32(acc.v, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(s), sx), ones));
  } else {
    acc.v = _mm512_add_epi32(acc.v, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), ones));
  }
}
#else
// AVX2: maddubs' int16 sums of pairs of products of one 32-byte half (widened by the caller, below)
template <bool WIDE>
inline __m256i pair_sums_half(__m256i w, __m256i x) {
  if (WIDE) {
    const __m256i s = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));  // q - 128 as int8
    return _mm256_maddubs_epi16(_mm256_abs_epi8(s), _mm256_sign_epi8(x, s));
  }
  return _mm256_maddubs_epi16(w, x);
}
#endif

// One 64-byte chunk (16 rows x 4 k, bytes as stored; for 4-bit blocks the caller unpacks).
#if defined(HS_AVX512)
using Chunk = __m512i;
inline Chunk load_chunk(const uint8_t* p) { return _mm512_loadu_si512((const void*)p); }
inline Chunk low_nibbles(Chunk c) { return _mm512_and_si512(c, _mm512_set1_epi8(0x0F)); }
inline Chunk high_nibbles(Chunk c) { return _mm512_and_si512(_mm512_srli_epi16(c, 4), _mm512_set1_epi8(0x0F)); }
template <bool WIDE>
inline void dot_chunk(I16& acc, Chunk w, int32_t x4) { dot4<WIDE>(acc, w, x4); }
#else
struct Chunk {
  __m256i lo, hi;
};
inline Chunk load_chunk(const uint8_t* p) {
  return {_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)(p + 32))};
}
inline Chunk low_nibbles(Chunk c) {
  const __m256i m = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(c.lo, m), _mm256_and_si256(c.hi, m)};
}
inline Chunk high_nibbles(Chunk c) {
  const __m256i m = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(_mm256_srli_epi16(c.lo, 4), m), _mm256_and_si256(_mm256_srli_epi16(c.hi, 4), m)};
}
#endif

// The four GGUF formats (packing.py FORMATS): value = d[superblock] * sc[group] * (q - offset)
// (- dmin[superblock] * m[group] for Q4_K); sc = 1 for Q8_0 and Q5_0, whose group is the super-block.
enum Kind : int32_t { Q8_0 = 0, Q5_0 = 1, Q6_K = 2, Q4_K = 3 };

#if !defined(HS_AVX512)
// AVX2's dot products in two steps: maddubs' int16 sums of pairs of products, added (exactly, in
// int16) over a run of chunks, then widened to the rows' int32 sums with one madd. A run is as long
// as int16 holds it: |pair| <= 2 * qmax * 128, so 8 chunks of 4-bit values (30720), 4 of 5-bit, 2 of
// 6-bit, 1 of 8-bit (sums of pairs could then reach 2^15; maddubs saturates as before).
struct P16 {
  __m256i lo, hi;
};
inline P16 pzero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
template <int KIND>
constexpr int pair_run() {
  return KIND == Q4_K ? 8 : KIND == Q5_0 ? 4 : KIND == Q6_K ? 2 : 1;
}
template <bool WIDE>
inline void pair_sums(P16& p, Chunk w, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  p.lo = _mm256_add_epi16(p.lo, pair_sums_half<WIDE>(w.lo, x));
  p.hi = _mm256_add_epi16(p.hi, pair_sums_half<WIDE>(w.hi, x));
}
inline void widen(I16& acc, P16 p) {
  const __m256i ones = _mm256_set1_epi16(1);
  acc.lo = _mm256_add_epi32(acc.lo, _mm256_madd_epi16(p.lo, ones));
  acc.hi = _mm256_add_epi32(acc.hi, _mm256_madd_epi16(p.hi, ones));
}
#endif

inline int32_t x4_at(const int8_t* x) {
  int32_t v;
  memcpy(&v, x, 4);
  return v;
}


struct Segment {
  const uint8_t* data;   // the blocks' units: [N/16][K/32][unit bytes]
  const uint16_t* d;     // fp16 [N/16][K/superblock][16]
  const uint8_t* sc;     // Q6_K int8, Q4_K uint8: [N/16][K/group][16]; else null
  const uint16_t* dmin;  // Q4_K: fp16 [N/16][K/256][16]
  const uint8_t* m;      // Q4_K: uint8 [N/16][K/32][16]
  const uint8_t* wide;   // [N/16]: 1 where a block holds bytes above 128 (Q8_0)
  const float* bias;     // [N] or null
  int64_t n;             // rows (a multiple of 16)
  int64_t col;           // first output column in y
  int32_t kind;
  int32_t reserved;
};

constexpr int UNIT_BYTES[4] = {512, 320, 384, 256};

// 16 fp16 as floats (exact), 16 int8 / uint8 as floats (exact)
#if defined(HS_AVX512)
inline V16 vload_f16(const uint16_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))}; }
inline V16 vload_i8(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)))};
}
inline V16 vload_u8(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)))};
}
#else
inline V16 vload_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
inline V16 vload_i8(const uint8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))))};
}
inline V16 vload_u8(const uint8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p))),
          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))))};
}
#endif

// A chunk's bits above the nibble (packing.py: byte p of a 64-byte field group holds, at bits
// w*j .. w*j+w-1, value p's high bits of chunk g*(8/w)+j), moved to bits 4.. of each byte: the
// group's bytes shifted by `left` (negative: right) and masked. The 16-bit shifts move bits across
// byte boundaries only into places the mask clears.
#if defined(HS_AVX512)
inline Chunk high_bits(const uint8_t* p, int left, char mask) {
  const __m512i v = _mm512_loadu_si512((const void*)p);
  const __m512i s = left >= 0 ? _mm512_slli_epi16(v, (unsigned)left) : _mm512_srli_epi16(v, (unsigned)-left);
  return _mm512_and_si512(s, _mm512_set1_epi8(mask));
}
inline Chunk chunk_or(Chunk a, Chunk b) { return _mm512_or_si512(a, b); }
#else
inline __m256i shift16(__m256i v, int left) {
  return left >= 0 ? _mm256_slli_epi16(v, left) : _mm256_srli_epi16(v, -left);
}
inline Chunk high_bits(const uint8_t* p, int left, char mask) {
  const Chunk v = load_chunk(p);
  const __m256i m = _mm256_set1_epi8(mask);
  return {_mm256_and_si256(shift16(v.lo, left), m), _mm256_and_si256(shift16(v.hi, left), m)};
}
inline Chunk chunk_or(Chunk a, Chunk b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
#endif

// Chunk c (0..7: k 4c .. 4c+3 of the unit) of a unit's values, unpacked to one byte per value.
template <int KIND>
inline Chunk unit_chunk(const uint8_t* unit, int c) {
  if constexpr (KIND == Q8_0) {
    return load_chunk(unit + c * CHUNK);
  } else {
    const Chunk packed = load_chunk(unit + (c / 2) * CHUNK);
    Chunk v = (c & 1) ? high_nibbles(packed) : low_nibbles(packed);
    if constexpr (KIND == Q5_0) v = chunk_or(v, high_bits(unit + 256, 4 - c, 0x10));  // bit c of each byte
    if constexpr (KIND == Q6_K)  // bits 2(c%4), 2(c%4)+1 of group c/4's bytes
      v = chunk_or(v, high_bits(unit + 256 + (c / 4) * CHUNK, 4 - 2 * (c % 4), 0x30));
    return v;
  }
}

constexpr int OFFSET[4] = {128, 16, 32, 0};

// The 16 rows of block `b` of `s` for tokens m0 .. m0 + MT - 1 (mt of them real). Per 32-k unit:
// the integer sums (per group of 16 for Q6_K), then the groups combined in float in order.
template <int KIND, int MT, bool WIDE>
void block_q(const Segment& s, int64_t b, const int8_t* xq, const float* xs, const float* xsum16, int64_t K,
             int mt, float* y, int64_t ldy) {
  const int64_t units = K / 32;
  const uint8_t* w = s.data + b * units * UNIT_BYTES[KIND];
  const int64_t supers = KIND == Q6_K || KIND == Q4_K ? K / 256 : units;
  const uint16_t* d = s.d + b * supers * ROWS;
  const V16 off = vset1((float)OFFSET[KIND]);
  V16 facc[MT];
  for (int m = 0; m < MT; ++m) facc[m] = vzero();
  for (int64_t u = 0; u < units; ++u) {
    const uint8_t* unit = w + u * UNIT_BYTES[KIND];
#if HS_PREFETCH_BYTES > 0
    for (int l = 0; l < UNIT_BYTES[KIND]; l += 64) _mm_prefetch((const char*)unit + HS_PREFETCH_BYTES + l, _MM_HINT_T0);
#endif
    constexpr int HALVES = KIND == Q6_K ? 2 : 1;  // Q6_K: two groups of 16 per unit
    I16 acc[HALVES][MT];
    for (int h = 0; h < HALVES; ++h)
      for (int m = 0; m < MT; ++m) acc[h][m] = izero();
#if defined(HS_AVX512)
    for (int c = 0; c < 8; ++c) {
      const Chunk wc = unit_chunk<KIND>(unit, c);
      const int h = HALVES == 2 ? c / 4 : 0;
      for (int m = 0; m < MT; ++m)
        if (m < mt) dot_chunk<WIDE>(acc[h][m], wc, x4_at(xq + m * K + u * 32 + 4 * c));
    }
#else
    // AVX2: maddubs' int16 pair sums added up over RUN chunks, then widened once (module doc)
    constexpr int RUN = pair_run<KIND>();
    for (int c0 = 0; c0 < 8; c0 += RUN) {
      P16 pairs[MT];
      for (int m = 0; m < MT; ++m) pairs[m] = pzero();
#pragma GCC unroll 8
      for (int c = c0; c < c0 + RUN; ++c) {
        const Chunk wc = unit_chunk<KIND>(unit, c);
        for (int m = 0; m < MT; ++m)
          if (m < mt) pair_sums<WIDE>(pairs[m], wc, x4_at(xq + m * K + u * 32 + 4 * c));
      }
      const int h = HALVES == 2 ? c0 / 4 : 0;
      for (int m = 0; m < MT; ++m)
        if (m < mt) widen(acc[h][m], pairs[m]);
    }
#endif
    for (int h = 0; h < HALVES; ++h) {
      V16 sg;  // the scale of this group for the 16 rows: d (x sc), exact
      if constexpr (KIND == Q6_K)
        sg = vmul(vload_f16(d + (u / 8) * ROWS), vload_i8(s.sc + (b * (K / 16) + 2 * u + h) * ROWS));
      else if constexpr (KIND == Q4_K)
        sg = vmul(vload_f16(d + (u / 8) * ROWS), vload_u8(s.sc + (b * units + u) * ROWS));
      else
        sg = vload_f16(d + u * ROWS);
      V16 mg = vzero();
      if constexpr (KIND == Q4_K)
        mg = vmul(vload_f16(s.dmin + (b * supers + u / 8) * ROWS), vload_u8(s.m + (b * units + u) * ROWS));
      for (int m = 0; m < MT; ++m) {
        if (m >= mt) break;
        const float xsg = xs[m * units + u];
        const float* sums = xsum16 + m * (K / 16) + 2 * u;
        const float xsum = HALVES == 2 ? sums[h] : sums[0] + sums[1];
        V16 dv = icvt(acc[h][m]);
        if constexpr (KIND == Q4_K) {
          facc[m] = vfma(dv, vmul(sg, vset1(xsg)), facc[m]);
          facc[m] = vfnma(vmul(mg, vset1(xsg)), vset1(xsum), facc[m]);
          continue;
        }
#if defined(HS_VNNI)
        dv = vfnma(off, vset1(xsum), dv);  // the offset's share, exactly (every term an integer < 2^24)
#else
        if (!WIDE) dv = vfnma(off, vset1(xsum), dv);  // WIDE sums were taken on q - 128 already
#endif
        facc[m] = vfma(dv, vmul(sg, vset1(xsg)), facc[m]);
      }
    }
  }
  for (int m = 0; m < mt; ++m) {
    V16 out = facc[m];
    if (s.bias) out = vadd(out, vload(s.bias + b * ROWS));
    vstore(y + m * ldy + s.col + b * ROWS, out);
  }
}

#if defined(HS_AVX512)
constexpr int MT = 8;  // tokens per pass over a block: 8 int + 8 float accumulators of 32 zmm
#else
constexpr int MT = 2;  // 2 x (2 int + 2 float) ymm accumulators of 16
#endif

template <int KIND>
void run_kind(const Segment& s, int64_t b, const int8_t* xq, const float* xs, const float* xsum16, int64_t K,
              int mt, float* y, int64_t ldy) {
  // one token (a decode step): a build of its own, with no unused accumulators or token checks
  const bool wide = KIND == Q8_0 && s.wide[b];
  if (mt == 1) {
    if (wide)
      block_q<KIND, 1, true>(s, b, xq, xs, xsum16, K, 1, y, ldy);
    else
      block_q<KIND, 1, false>(s, b, xq, xs, xsum16, K, 1, y, ldy);
  } else if (wide) {
    block_q<KIND, MT, true>(s, b, xq, xs, xsum16, K, mt, y, ldy);
  } else {
    block_q<KIND, MT, false>(s, b, xq, xs, xsum16, K, mt, y, ldy);
  }
}

void run_block(const Segment& s, int64_t b, const int8_t* xq, const float* xs, const float* xsum16, int64_t M,
               int64_t K, float* y, int64_t ldy) {
  for (int64_t m0 = 0; m0 < M; m0 += MT) {
    const int mt = (int)(M - m0 < MT ? M - m0 : MT);
    const int8_t* xqm = xq + m0 * K;
    const float* xsm = xs + m0 * (K / 32);
    const float* xsumm = xsum16 + m0 * (K / 16);
    float* ym = y + m0 * ldy;
    switch (s.kind) {
      case Q8_0: run_kind<Q8_0>(s, b, xqm, xsm, xsumm, K, mt, ym, ldy); break;
      case Q5_0: run_kind<Q5_0>(s, b, xqm, xsm, xsumm, K, mt, ym, ldy); break;
      case Q6_K: run_kind<Q6_K>(s, b, xqm, xsm, xsumm, K, mt, ym, ldy); break;
      default: run_kind<Q4_K>(s, b, xqm, xsm, xsumm, K, mt, ym, ldy); break;
    }
  }
}

// Every segment's blocks split in contiguous ranges over the threads, by their bytes.
void matmul(const int8_t* xq, const float* xs, const float* xsum16, int64_t M, int64_t K, const Segment* segs,
            int nseg, float* y, int64_t ldy, int threads) {
  std::vector<int64_t> first(nseg + 1, 0);
  std::vector<double> cost(nseg);
  double total = 0;
  for (int i = 0; i < nseg; ++i) {
    first[i + 1] = first[i] + segs[i].n / ROWS;
    cost[i] = UNIT_BYTES[segs[i].kind] / 512.0 + 0.15;  // a block's bytes, and a little for its unpacking
    total += cost[i] * (double)(segs[i].n / ROWS);
  }
  pool().run(threads, [&](int t, int nt) {
    const double lo = total * t / nt, hi = total * (t + 1) / nt;
    double at = 0;
    for (int i = 0; i < nseg; ++i) {
      const int64_t blocks = segs[i].n / ROWS;
      const double c = cost[i];
      // this thread's blocks of segment i: those whose cost-start lies in [lo, hi)
      int64_t b0 = (int64_t)ceil((lo - at) / c), b1 = (int64_t)ceil((hi - at) / c);
      b0 = b0 < 0 ? 0 : b0 > blocks ? blocks : b0;
      b1 = b1 < 0 ? 0 : b1 > blocks ? blocks : b1;
      if (t == nt - 1) b1 = blocks;
      for (int64_t b = b0; b < b1; ++b) run_block(segs[i], b, xq, xs, xsum16, M, K, y, ldy);
      at += c * (double)blocks;
    }
  });
}

// ---- the rows' new tokens' attention over their caches (float32 caches) ----
// As native.cpp's, in V16 operations so that every build gives the same bits: a score is one
// 16-lane FMA accumulator over dim and `vhsum`; softmax in float32 (vexp, a sequential sum);
// the weighted sum one FMA per value and element, values in order.
void attend_query(const float* qh, int64_t visible, int nseg, const float* const* keys, const float* const* values,
                  const int64_t* lengths, const int64_t* kstride, const int64_t* vstride, int g, int dim, float scale,
                  float* scores, float* oh) {
  int64_t at = 0;
  for (int s = 0; s < nseg && at < visible; ++s) {
    const float* k = keys[s] + g * kstride[s];
    const int64_t len = lengths[s] < visible - at ? lengths[s] : visible - at;
    for (int64_t j = 0; j < len; ++j) {
      const float* kj = k + j * dim;
      V16 acc = vzero();
      for (int d = 0; d < dim; d += 16) acc = vfma(vload(qh + d), vload(kj + d), acc);
      scores[at + j] = vhsum(acc) * scale;
    }
    at += len;
  }
  float best = -INFINITY;
  for (int64_t j = 0; j < visible; ++j) best = scores[j] > best ? scores[j] : best;
  int64_t j = 0;
  for (; j + 16 <= visible; j += 16) vstore(scores + j, vexp(vsub(vload(scores + j), vset1(best))));
  if (j < visible) {
    float tail[16];
    for (int l = 0; l < 16; ++l) tail[l] = j + l < visible ? scores[j + l] - best : -100.f;
    vstore(tail, vexp(vload(tail)));
    for (int l = 0; j + l < visible; ++l) scores[j + l] = tail[l];
  }
  float sum = 0.f;
  for (int64_t i = 0; i < visible; ++i) sum += scores[i];
  for (int64_t i = 0; i < visible; ++i) scores[i] /= sum;
  for (int d = 0; d < dim; d += 16) {
    V16 acc = vzero();
    int64_t base = 0;
    for (int s = 0; s < nseg && base < visible; ++s) {
      const float* v = values[s] + g * vstride[s] + d;
      const int64_t len = lengths[s] < visible - base ? lengths[s] : visible - base;
      for (int64_t i = 0; i < len; ++i) acc = vfma(vset1(scores[base + i]), vload(v + i * dim), acc);
      base += len;
    }
    vstore(oh + d, acc);
  }
}

void attend_batch(const float* q, int nrows, const int* nq, int heads, int kv_heads, int dim, float scale,
                  const int* nseg, const float* const* keys, const float* const* values, const int64_t* lengths,
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
  const int n = (int)(items < threads ? (items > 0 ? items : 1) : threads);
  pool().run(n, [&](int thread, int nt) {
    std::vector<float> scores(longest > 0 ? longest : 1);
    for (int64_t i = items * thread / nt; i < items * (thread + 1) / nt; ++i) {
      const int64_t token = i / heads;
      const int h = (int)(i % heads), r = token_row[token], sf = seg_first[r];
      const int64_t t = token - token_first[r];
      const int64_t visible = row_total[r] - (nq[r] - 1 - t);
      attend_query(q + i * dim, visible, nseg[r], keys + sf, values + sf, lengths + sf, kstride + sf, vstride + sf,
                   h / group, dim, scale, scores.data(), out + i * dim);
    }
  });
}


// ---- one decoder layer of a Llama-family model (Qwen2), fused ----
// What model_runner.extend_rows does per layer with the model's modules, in one call: RMSNorm,
// q/k/v (one matmul, biases in it), RoPE (rotate-half, as transformers: x * cos + rot(x) * sin,
// each product rounded), the rows' causal attention over their caches and their new keys,
// o projection and residual, RMSNorm, gate/up (one matmul), SiLU(gate) * up, down and residual.
// Every step is elementwise or sums in a fixed order in V16 lanes: the same bits on every build.
struct LayerWeights {
  const float* norm1;
  const float* norm2;
  const Segment* qkv;  // q, k, v
  const Segment* o;
  const Segment* gate_up;  // gate, up
  const Segment* down;
  int32_t nqkv, ngate_up;
};

struct LayerShape {
  int64_t hidden, inter;
  int32_t heads, kv_heads, dim;
  float eps, scale;
};

// out = w * (x * (1 / sqrt(mean(x^2) + eps))), per token
void rms_norm(const float* x, const float* w, int64_t T, int64_t H, float eps, float* out, int threads) {
  parallel_for(T, threads, 8, [&](int64_t t) {
    const float* xt = x + t * H;
    V16 acc = vzero();
    for (int64_t i = 0; i < H; i += 16) {
      const V16 v = vload(xt + i);
      acc = vfma(v, v, acc);
    }
    const float r = 1.f / sqrtf(vhsum(acc) / (float)H + eps);
    float* ot = out + t * H;
    for (int64_t i = 0; i < H; i += 16) vstore(ot + i, vmul(vload(w + i), vmul(vload(xt + i), vset1(r))));
  });
}

// x (dim values) rotated in place: x * cos + rotate_half(x) * sin
inline void rope(float* x, const float* c, const float* s, int dim) {
  const int half = dim / 2;
  float rot[256];
  for (int i = 0; i < half; ++i) {
    rot[i] = -x[i + half];
    rot[i + half] = x[i];
  }
  for (int i = 0; i < dim; i += 16) vstore(x + i, vadd(vmul(vload(x + i), vload(c + i)), vmul(vload(rot + i), vload(s + i))));
}

void quantized_matmul(const float* x, int64_t T, int64_t K, const Segment* segs, int nseg, float* y, int64_t ldy,
                      int threads, int8_t* xq, float* xs, float* xsum) {
  quantize_rows(x, T, K, xq, xs, xsum, threads);
  matmul(xq, xs, xsum, T, K, segs, nseg, y, ldy, threads);
}

// The scratch of one decoder_layer call over T tokens, carved from one caller-owned block
// (the caller reuses it for every layer of a forward and frees a large one after it: a
// block per array per layer, freed inside the call, left glibc's heap holding a prefill's
// tens of MiB after it; issue 32's replica RSS). Arrays start on 64-byte boundaries.
struct LayerScratch {
  float *xn, *qkv, *att, *mlp, *act, *proj, *q, *xs, *xsum;
  int8_t* xq;
};

inline int64_t round64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

int64_t layer_scratch(int64_t T, const LayerShape& sh, uint8_t* base, LayerScratch* out) {
  const int64_t H = sh.hidden, I = sh.inter;
  const int64_t qw = (int64_t)sh.heads * sh.dim, width = qw + 2 * (int64_t)sh.kv_heads * sh.dim;
  const int64_t kmax = std::max(std::max(H, qw), I);  // the widest input a quantized matmul gets
  const int64_t floats[9] = {T * H, T * width, T * qw, T * 2 * I, T * I, T * H, T * qw, T * kmax / 32, T * kmax / 16};
  float** slots[9] = {&out->xn, &out->qkv, &out->att, &out->mlp, &out->act, &out->proj, &out->q, &out->xs, &out->xsum};
  int64_t at = 0;
  for (int i = 0; i < 9; ++i) {
    if (base) *slots[i] = (float*)(base + at);
    at += round64(floats[i] * (int64_t)sizeof(float));
  }
  if (base) out->xq = (int8_t*)(base + at);
  return at + round64(T * kmax);
}

// hidden [T, H] in place. Rows: nrows rows of nq[r] tokens each (packed in order); row r has
// nseg[r] cache pieces (keys/values/lengths/strides as attend_batch's, listed row after row)
// before its new tokens. new_k, new_v: [kv_heads, T, dim] out: the new tokens' keys (after RoPE)
// and values, which the caller appends to each row's cache. cos, sin: [T, dim].
void decoder_layer(float* hidden, int64_t T, const LayerWeights& w, const LayerShape& sh, const float* cos,
                   const float* sin, int nrows, const int* nq, const int* nseg, const float* const* keys,
                   const float* const* values, const int64_t* lengths, const int64_t* kstride,
                   const int64_t* vstride, float* new_k, float* new_v, uint8_t* scratch, int threads) {
  const int64_t H = sh.hidden, I = sh.inter;
  const int heads = sh.heads, kvh = sh.kv_heads, dim = sh.dim;
  const int64_t qw = (int64_t)heads * dim, kw = (int64_t)kvh * dim, width = qw + 2 * kw;
  LayerScratch ws;
  layer_scratch(T, sh, scratch, &ws);
  float *xn = ws.xn, *qkv = ws.qkv, *att = ws.att, *mlp = ws.mlp, *act = ws.act, *proj = ws.proj, *q = ws.q;
  int8_t* xq = ws.xq;
  float *xs = ws.xs, *xsum = ws.xsum;
  rms_norm(hidden, w.norm1, T, H, sh.eps, xn, threads);
  quantized_matmul(xn, T, H, w.qkv, w.nqkv, qkv, width, threads, xq, xs, xsum);
  // RoPE on q and k; k and v to [kv_heads, T, dim]
  parallel_for(T, threads, 8, [&](int64_t t) {
    const float* row = qkv + t * width;
    const float* c = cos + t * dim;
    const float* s = sin + t * dim;
    for (int h = 0; h < heads; ++h) {
      float* qh = q + (t * heads + h) * dim;
      memcpy(qh, row + h * dim, dim * sizeof(float));
      rope(qh, c, s, dim);
    }
    for (int g = 0; g < kvh; ++g) {
      float* kg = new_k + ((int64_t)g * T + t) * dim;
      memcpy(kg, row + qw + g * dim, dim * sizeof(float));
      rope(kg, c, s, dim);
      memcpy(new_v + ((int64_t)g * T + t) * dim, row + qw + kw + g * dim, dim * sizeof(float));
    }
  });
  // each row's pieces: its cache pieces, then its new tokens (in new_k / new_v)
  int total_pieces = 0;
  for (int r = 0; r < nrows; ++r) total_pieces += nseg[r] + 1;
  std::vector<const float*> pk(total_pieces), pv(total_pieces);
  std::vector<int64_t> plen(total_pieces), pks(total_pieces), pvs(total_pieces);
  std::vector<int> pseg(nrows);
  for (int r = 0, src = 0, dst = 0, tok = 0; r < nrows; ++r) {
    for (int i = 0; i < nseg[r]; ++i, ++src, ++dst) {
      pk[dst] = keys[src];
      pv[dst] = values[src];
      plen[dst] = lengths[src];
      pks[dst] = kstride[src];
      pvs[dst] = vstride[src];
    }
    pk[dst] = new_k + (int64_t)tok * dim;
    pv[dst] = new_v + (int64_t)tok * dim;
    plen[dst] = nq[r];
    pks[dst] = T * dim;
    pvs[dst] = T * dim;
    ++dst;
    pseg[r] = nseg[r] + 1;
    tok += nq[r];
  }
  attend_batch(q, nrows, nq, heads, kvh, dim, sh.scale, pseg.data(), pk.data(), pv.data(), plen.data(),
               pks.data(), pvs.data(), att, threads);
  quantized_matmul(att, T, qw, w.o, 1, proj, H, threads, xq, xs, xsum);
  for (int64_t i = 0; i < T * H; i += 16) vstore(hidden + i, vadd(vload(hidden + i), vload(proj + i)));
  rms_norm(hidden, w.norm2, T, H, sh.eps, xn, threads);
  quantized_matmul(xn, T, H, w.gate_up, w.ngate_up, mlp, 2 * I, threads, xq, xs, xsum);
  parallel_for(T, threads, 8, [&](int64_t t) {
    const float* g = mlp + t * 2 * I;
    const float* u = g + I;
    float* a = act + t * I;
    for (int64_t i = 0; i < I; i += 16) {
      const V16 gv = vload(g + i);
      const V16 silu = vdiv(gv, vadd(vset1(1.f), vexp(vsub(vzero(), gv))));
      vstore(a + i, vmul(silu, vload(u + i)));
    }
  });
  quantized_matmul(act, T, I, w.down, 1, proj, H, threads, xq, xs, xsum);
  for (int64_t i = 0; i < T * H; i += 16) vstore(hidden + i, vadd(vload(hidden + i), vload(proj + i)));
}

}  // namespace

extern "C" {
// The ABI version quant_kernel.py checks: bump it when a signature changes.
int hs_q_abi_version(void) { return 4; }

// Which build this is: 2 (AVX2), 5 (AVX-512), 6 (AVX-512 with VNNI).
int hs_q_isa(void) {
#if defined(HS_VNNI)
  return 6;
#elif defined(HS_AVX512)
  return 5;
#else
  return 2;
#endif
}

void hs_q_quantize(const float* x, int64_t M, int64_t K, int8_t* xq, float* xs, float* xsum16, int threads) {
  quantize_rows(x, M, K, xq, xs, xsum16, threads);
}

void hs_q_matmul(const int8_t* xq, const float* xs, const float* xsum16, int64_t M, int64_t K, const Segment* segs,
                 int nseg, float* y, int64_t ldy, int threads) {
  matmul(xq, xs, xsum16, M, K, segs, nseg, y, ldy, threads);
}

void hs_q_attend_batch(const float* q, int nrows, const int* nq, int heads, int kv_heads, int dim, float scale,
                       const int* nseg, const float* const* keys, const float* const* values, const int64_t* lengths,
                       const int64_t* kstride, const int64_t* vstride, float* out, int threads) {
  attend_batch(q, nrows, nq, heads, kv_heads, dim, scale, nseg, keys, values, lengths, kstride, vstride, out, threads);
}

void hs_q_layer(float* hidden, int64_t T, const LayerWeights* w, const LayerShape* shape, const float* cos,
                const float* sin, int nrows, const int* nq, const int* nseg, const float* const* keys,
                const float* const* values, const int64_t* lengths, const int64_t* kstride, const int64_t* vstride,
                float* new_k, float* new_v, uint8_t* scratch, int threads) {
  decoder_layer(hidden, T, *w, *shape, cos, sin, nrows, nq, nseg, keys, values, lengths, kstride, vstride, new_k,
                new_v, scratch, threads);
}

// Bytes of the scratch block hs_q_layer needs for T tokens of a layer of this shape.
int64_t hs_q_layer_scratch_bytes(int64_t T, const LayerShape* shape) {
  LayerScratch unused;
  return layer_scratch(T, *shape, nullptr, &unused);
}
}
