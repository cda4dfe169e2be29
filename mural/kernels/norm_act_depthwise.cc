// Training batch norm + swish + depthwise SAME conv as one pass over memory, forward
// and backward, for XLA's CPU runtime (built and registered by mural/kernels/__init__.py;
// the maths is mural/models/norm_ops.py's norm_act_depthwise_conv), also with the
// block's expand conv before it (native_expand_norm_act_depthwise: x @ w computed image
// by image, and its gradients taken from dz band by band). At the end, the passes of
// the norm + swish + squeeze-excite after it (native_norm_act_squeeze_excite).
//
// Why: XLA runs this op as many elementwise and reduction passes, each writing an
// activation of the block's widest shape out to memory; here an image's activation and
// its gradient live in a per-thread scratch that is reused image after image, and only
// the results are written out (the forward reads x once, the backward twice). Images
// (forward) and parts of the batch (backward) are spread over XLA's intra-op thread pool.
//
// Layouts: x [B, H, W, C] (NHWC), kernel [K, K, C], y and g [B, H', W', C] with
// H' = ceil(H / stride); SAME padding as TF/XLA (the odd pixel after). The batch
// statistics come in (mean, inv = rsqrt(var + eps)), computed by XLA.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Registers of float32 lanes (GCC's vector extension; loads need not be aligned): one
// AVX-512 register, half of one, and a single float for a channel count's remainder;
// and int32 registers of the same widths (Exp's exponent bits). (GCC ignores the
// attribute on an alias template, hence the typedefs.)
typedef float Vec16 __attribute__((vector_size(16 * sizeof(float)), aligned(sizeof(float))));
typedef float Vec8 __attribute__((vector_size(8 * sizeof(float)), aligned(sizeof(float))));
typedef int32_t Int16 __attribute__((vector_size(16 * sizeof(int32_t))));
typedef int32_t Int8 __attribute__((vector_size(8 * sizeof(int32_t))));
template <int64_t n> struct VecOf;
template <> struct VecOf<16> { using type = Vec16; using Int = Int16; };
template <> struct VecOf<8> { using type = Vec8; using Int = Int8; };
template <> struct VecOf<1> { using type = float; using Int = int32_t; };
template <int64_t n> using Vec = typename VecOf<n>::type;

template <int64_t n> inline Vec<n> Load(const float* p) {
  return *reinterpret_cast<const Vec<n>*>(p);
}
template <int64_t n> inline void Store(float* p, const Vec<n>& v) {
  *reinterpret_cast<Vec<n>*>(p) = v;
}

// The widest register the CPU has. Without AVX-512, GCC 12 runs Vec16's arithmetic
// through memory: the matmuls below ran at 5.5 GFLOP/s on an AVX2 EPYC, 67 with Vec8.
#ifdef __AVX512F__
constexpr int64_t kVecLanes = 16;
#else
constexpr int64_t kVecLanes = 8;
#endif

// A chunk of channels: m registers of n lanes.
template <int64_t n, int64_t m> struct Lanes {
  static constexpr int64_t kN = n, kM = m;
};

// Calls chunk(c0, Lanes<n, m>()) on consecutive chunks that cover channels [0, c):
// `regs` registers of the CPU's width (independent sums that hide the FMA's latency),
// then one, then with AVX-512 one of 8 lanes, then single channels. (B0's 24 and 40
// channels leave 8 over 16: with them as single floats, blocks 2 and 3's backward, whose
// expand conv's input gradient is 24 channels wide, ran 1.66-1.81x slower on a Xeon.)
template <int64_t regs, typename Chunk>
inline void ForChunks(int64_t c, const Chunk& chunk) {
  int64_t c0 = 0;
  if constexpr (regs > 1) {
    for (; c0 + regs * kVecLanes <= c; c0 += regs * kVecLanes) chunk(c0, Lanes<kVecLanes, regs>());
  }
  for (; c0 + kVecLanes <= c; c0 += kVecLanes) chunk(c0, Lanes<kVecLanes, 1>());
  if constexpr (kVecLanes > 8) {
    if (c0 + 8 <= c) {
      chunk(c0, Lanes<8, 1>());
      c0 += 8;
    }
  }
  for (; c0 < c; ++c0) chunk(c0, Lanes<1, 1>());
}

// exp(x) on a float or a register of floats (V = Vec<n>): Cephes' single-precision
// polynomial (relative error about 1e-7), n = round(x / ln 2) by the 1.5 * 2^23 shift.
// NaN passes through. The loops that call it are written on GCC's vectors rather than
// left to its vectoriser, whose code for the scalar form (the clamps turned into blends
// around the divide) varied with the loop around it: on an AVX2 EPYC the squeeze-excite
// ops ran 1.06-1.26x faster this way and the depthwise backward 1.04-1.13x, the
// forward as before (benchmarks/README.md).
template <typename V>
inline V Exp(V x) {
  x = x > 88.0f ? V{} + 88.0f : x;
  x = x < -87.0f ? V{} - 87.0f : x;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer.
  const V shifted = x * 1.44269504088896341f + kShift;
  const V n = shifted - kShift;
  V r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  typename VecOf<sizeof(V) / sizeof(float)>::Int bits;  // n + 127 as an exponent: 2^n.
  std::memcpy(&bits, &shifted, sizeof(bits));
  bits = (bits - 0x4B400000 + 127) << 23;
  V two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return p * two_n;
}

template <typename V> inline V Sigmoid(V z) { return 1.0f / (1.0f + Exp(-z)); }

// swish'(z), given sig = Sigmoid(z).
template <typename V> inline V SwishSlope(V z, V sig) {
  return sig * (1.0f + z * (1.0f - sig));
}

// The norm's output z = (x - mean) * a + bias at channels [i, i + n); with `centred`,
// also x - mean there. The elementwise loops call it through ForChunks<1> (see Exp).
template <int64_t n>
inline Vec<n> NormZ(int64_t i, const float* x, const float* mean, const float* a,
                    const float* bias, Vec<n>* centred = nullptr) {
  const Vec<n> d = Load<n>(x + i) - Load<n>(mean + i);
  if (centred != nullptr) *centred = d;
  return d * Load<n>(a + i) + Load<n>(bias + i);
}

struct Geometry {
  int64_t b, h, w, c, k, stride, out_h, out_w, top, left, pad_h, pad_w;
};

// SAME padding of one axis: (before, padded size).
void Same(int64_t size, int64_t k, int64_t stride, int64_t* out, int64_t* before,
          int64_t* padded) {
  *out = (size + stride - 1) / stride;
  const int64_t total = std::max<int64_t>((*out - 1) * stride + k - size, 0);
  *before = total / 2;
  *padded = size + total;
}

ffi::Error MakeGeometry(int64_t b, int64_t h, int64_t w, int64_t c,
                        ffi::Buffer<ffi::F32>& kernel, int64_t stride, Geometry* g) {
  auto kd = kernel.dimensions();
  if (kd.size() != 3 || kd[0] != kd[1] || kd[2] != c || stride < 1) {
    return ffi::Error::InvalidArgument(
        "norm_act_depthwise: want x [B, H, W, C], kernel [K, K, C], stride >= 1");
  }
  g->b = b, g->h = h, g->w = w, g->c = c, g->k = kd[0], g->stride = stride;
  Same(g->h, g->k, stride, &g->out_h, &g->top, &g->pad_h);
  Same(g->w, g->k, stride, &g->out_w, &g->left, &g->pad_w);
  return ffi::Error::Success();
}

ffi::Error MakeGeometry(ffi::Buffer<ffi::F32>& x, ffi::Buffer<ffi::F32>& kernel,
                        int64_t stride, Geometry* g) {
  auto xd = x.dimensions();
  if (xd.size() != 4) {
    return ffi::Error::InvalidArgument("norm_act_depthwise: want x [B, H, W, C]");
  }
  return MakeGeometry(xd[0], xd[1], xd[2], xd[3], kernel, stride, g);
}

// Runs body(i) for i in [0, n) on the caller and the pool's other threads: each takes
// the next index from a shared counter. The state is shared, so a helper that starts
// after the work is done finds nothing to do and touches nothing of the caller's.
template <typename Body>
void ParallelFor(ffi::ThreadPool& pool, int64_t n, const Body& body) {
  struct State {
    std::atomic<int64_t> next{0}, done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  const Body* fn = &body;
  auto run = [state, n, fn]() {
    for (int64_t i; (i = state->next.fetch_add(1)) < n;) {
      (*fn)(i);
      if (state->done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->cv.notify_all();
      }
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n) - 1;
  for (int64_t t = 0; t < helpers; ++t) {
    auto task = run;
    pool.Schedule(std::move(task));
  }
  run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == n; });
}

// A per-thread buffer that grows and is kept (no page faults per image).
float* Scratch(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// a = inv * scale per channel, as the XLA forward computes it.
std::vector<float> NormScale(const float* inv, const float* scale, int64_t c) {
  std::vector<float> a(c);
  for (int64_t i = 0; i < c; ++i) a[i] = inv[i] * scale[i];
  return a;
}

// The padded activation swish((x - mean) * a + bias) of one image, zeros around it.
void Activation(const Geometry& g, const float* x, const float* mean, const float* a,
                const float* bias, float* s) {
  const int64_t c = g.c, row = g.pad_w * c;
  std::fill(s, s + g.top * row, 0.0f);
  std::fill(s + (g.top + g.h) * row, s + g.pad_h * row, 0.0f);
  for (int64_t u = 0; u < g.h; ++u) {
    float* srow = s + (g.top + u) * row;
    std::fill(srow, srow + g.left * c, 0.0f);
    std::fill(srow + (g.left + g.w) * c, srow + row, 0.0f);
    for (int64_t v = 0; v < g.w; ++v) {
      const float* xp = x + (u * g.w + v) * c;
      float* sp = srow + (g.left + v) * c;
      ForChunks<1>(c, [&](int64_t i, auto lanes) {
        constexpr int64_t n = decltype(lanes)::kN;
        const Vec<n> z = NormZ<n>(i, xp, mean, a, bias);
        Store<n>(sp + i, z * Sigmoid(z));
      });
    }
  }
}

// One pixel of the backward's last pass: dz = ds * swish'(z), and the two row sums.
void DzPixel(int64_t c, const float* __restrict x, const float* __restrict ds,
             const float* __restrict mean, const float* __restrict inv,
             const float* __restrict a, const float* __restrict bias, float* __restrict dz,
             float* __restrict sums) {
  ForChunks<1>(c, [&](int64_t i, auto lanes) {
    constexpr int64_t n = decltype(lanes)::kN;
    Vec<n> centred;
    const Vec<n> z = NormZ<n>(i, x, mean, a, bias, &centred);
    const Vec<n> d = Load<n>(ds + i) * SwishSlope(z, Sigmoid(z));
    Store<n>(dz + i, d);
    Store<n>(sums + i, Load<n>(sums + i) + d);
    Store<n>(sums + c + i, Load<n>(sums + c + i) + d * (centred * Load<n>(inv + i)));
  });
}

// The depthwise conv's loops keep 4 registers of sums.
constexpr int64_t kConvRegs = 4;

// out[ch] = sum_ij base[i * row + j * c + ch] * kernel[(i * k + j) * c + ch], ch < n * m.
template <int64_t n, int64_t m>
inline void ConvChunk(int64_t k, int64_t row, int64_t c, const float* __restrict base,
                      const float* __restrict kernel, float* __restrict out) {
  Vec<n> acc[m] = {};
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const float* sp = base + i * row + j * c;
      const float* kp = kernel + (i * k + j) * c;
      for (int64_t r = 0; r < m; ++r) acc[r] += Load<n>(sp + r * n) * Load<n>(kp + r * n);
    }
  }
  for (int64_t r = 0; r < m; ++r) Store<n>(out + r * n, acc[r]);
}

// One output pixel of the forward: base is the padded activation at its first tap.
void ConvPixel(const Geometry& g, const float* base, const float* kernel, float* out) {
  const int64_t row = g.pad_w * g.c;
  ForChunks<kConvRegs>(g.c, [&](int64_t c0, auto lanes) {
    using L = decltype(lanes);
    ConvChunk<L::kN, L::kM>(g.k, row, g.c, base + c0, kernel + c0, out + c0);
  });
}

// One output row oh of the backward, channels [c0, c0 + n * m): ds (over the padded
// grid) gets grad * kernel at each tap, and dk each tap's sum over the row of s * grad.
template <int64_t n, int64_t m>
inline void ScatterChunk(const Geometry& g, int64_t oh, int64_t c0, const float* __restrict s,
                         float* __restrict ds, const float* __restrict grad,
                         const float* __restrict kernel, float* __restrict dk) {
  const int64_t c = g.c;
  for (int64_t i = 0; i < g.k; ++i) {
    for (int64_t j = 0; j < g.k; ++j) {
      const int64_t tap = (i * g.k + j) * c + c0;
      const int64_t at = ((oh * g.stride + i) * g.pad_w + j) * c + c0;
      Vec<n> kv[m], acc[m] = {};
      for (int64_t r = 0; r < m; ++r) kv[r] = Load<n>(kernel + tap + r * n);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const float* gp = grad + ow * c + c0;
        const int64_t p = at + ow * g.stride * c;
        for (int64_t r = 0; r < m; ++r) {
          const Vec<n> gv = Load<n>(gp + r * n);
          Store<n>(ds + p + r * n, Load<n>(ds + p + r * n) + gv * kv[r]);
          acc[r] += Load<n>(s + p + r * n) * gv;
        }
      }
      for (int64_t r = 0; r < m; ++r) {
        Store<n>(dk + tap + r * n, Load<n>(dk + tap + r * n) + acc[r]);
      }
    }
  }
}

void ScatterRow(const Geometry& g, int64_t oh, const float* s, float* ds, const float* grad,
                const float* kernel, float* dk) {
  ForChunks<kConvRegs>(g.c, [&](int64_t c0, auto lanes) {
    using L = decltype(lanes);
    ScatterChunk<L::kN, L::kM>(g, oh, c0, s, ds, grad, kernel, dk);
  });
}

// y[p, l] = sum_i x[p, i] * w[i, l] for q pixels and n channels: x [q, k] (rows of k),
// w and y rows of c. The q sums stay in registers over the k inputs (written with GCC's
// vectors: it did not keep plain loops' sums in registers, about 20 GFLOP/s).
template <int64_t q, int64_t n>
inline void ExpandChunk(int64_t k, int64_t c, const float* __restrict x,
                        const float* __restrict w, float* __restrict y) {
  Vec<n> acc[q] = {};
  for (int64_t i = 0; i < k; ++i) {
    const Vec<n> wv = Load<n>(w + i * c);
    for (int64_t p = 0; p < q; ++p) acc[p] += x[p * k + i] * wv;
  }
  for (int64_t p = 0; p < q; ++p) Store<n>(y + p * c, acc[p]);
}

template <int64_t q>
void ExpandPixels(int64_t k, int64_t c, const float* x, const float* w, float* y) {
  ForChunks<1>(c, [&](int64_t c0, auto lanes) {
    ExpandChunk<q, decltype(lanes)::kN>(k, c, x, w + c0, y + c0);
  });
}

// y = x @ w over one image's pixels: x [pixels, k], w [k, c], y [pixels, c].
void Expand(int64_t pixels, int64_t k, int64_t c, const float* x, const float* w, float* y) {
  constexpr int64_t kPixels = 8;  // 8 independent sums in flight hide the FMA latency.
  int64_t p = 0;
  for (; p + kPixels <= pixels; p += kPixels) ExpandPixels<kPixels>(k, c, x + p * k, w, y + p * c);
  for (; p < pixels; ++p) ExpandPixels<1>(k, c, x + p * k, w, y + p * c);
}

// out[i, l] += sum_p a[p, i] * b[p, l] for rows i < t of out and n channels: a [pixels,
// k], b and out rows of c. The t sums stay in registers over the pixels.
template <int64_t t, int64_t n>
inline void OuterChunk(int64_t pixels, int64_t k, int64_t c, const float* __restrict a,
                       const float* __restrict b, float* __restrict out) {
  Vec<n> acc[t];
  for (int64_t r = 0; r < t; ++r) acc[r] = Load<n>(out + r * c);
  for (int64_t p = 0; p < pixels; ++p) {
    const Vec<n> bv = Load<n>(b + p * c);
    for (int64_t r = 0; r < t; ++r) acc[r] += a[p * k + r] * bv;
  }
  for (int64_t r = 0; r < t; ++r) Store<n>(out + r * c, acc[r]);
}

template <int64_t t>
void OuterRows(int64_t pixels, int64_t k, int64_t c, const float* a, const float* b, float* out) {
  ForChunks<1>(c, [&](int64_t c0, auto lanes) {
    OuterChunk<t, decltype(lanes)::kN>(pixels, k, c, a, b + c0, out + c0);
  });
}

// out += a' b over pixels: a [pixels, k], b [pixels, c], out [k, c].
void AccumulateOuter(int64_t pixels, int64_t k, int64_t c, const float* a, const float* b,
                     float* out) {
  constexpr int64_t kRows = 8;
  int64_t i = 0;
  for (; i + kRows <= k; i += kRows) OuterRows<kRows>(pixels, k, c, a + i, b, out + i * c);
  for (; i < k; ++i) OuterRows<1>(pixels, k, c, a + i, b, out + i * c);
}

// Where an op's input (the norm's input) comes from, image by image: x [B, H, W, C]
// itself, or x [B, H, W, K] @ w [K, C] (the block's expand conv), computed into a
// per-thread scratch and never written out.
struct Source {
  const float* x;
  const float* w = nullptr;  // No expand conv.
  int64_t k = 0;             // x's channels when expanding.

  const float* Image(const Geometry& g, int64_t b, std::vector<float>& scratch) const {
    const int64_t pixels = g.h * g.w;
    if (w == nullptr) return x + b * pixels * g.c;
    float* y = Scratch(scratch, pixels * g.c);
    Expand(pixels, k, g.c, x + b * pixels * k, w, y);
    return y;
  }
};

// The norm's four vectors, one value per channel of the norm's input.
ffi::Error CheckNorm(const Geometry& g, ffi::Buffer<ffi::F32>& mean, ffi::Buffer<ffi::F32>& inv,
                     ffi::Buffer<ffi::F32>& scale, ffi::Buffer<ffi::F32>& bias) {
  if (mean.element_count() != g.c || inv.element_count() != g.c ||
      scale.element_count() != g.c || bias.element_count() != g.c) {
    return ffi::Error::InvalidArgument(
        "norm_act_depthwise: want mean, inv, scale, bias [C], C the norm input's channels");
  }
  return ffi::Error::Success();
}

// out[j] = sum over t < parts of partials[t * stride + j] for j < n, the parts added in
// order whatever the threads (blocks of j spread over the pool).
void SumParts(ffi::ThreadPool& pool, int64_t parts, int64_t n, int64_t stride,
              const float* partials, float* out) {
  constexpr int64_t kBlock = 2048;
  ParallelFor(pool, (n + kBlock - 1) / kBlock, [&](int64_t block) {
    const int64_t lo = block * kBlock, hi = std::min(n, lo + kBlock);
    std::copy(partials + lo, partials + hi, out + lo);
    for (int64_t t = 1; t < parts; ++t) {
      const float* __restrict p = partials + t * stride;
      float* __restrict o = out;
      for (int64_t j = lo; j < hi; ++j) o[j] += p[j];
    }
  });
}

// sums[0, c) += the sums over pixels of v [pixels, c], sums[c, 2c) of v * v.
void AddMoments(int64_t pixels, int64_t c, const float* __restrict v, float* __restrict sums) {
  ForChunks<1>(c, [&](int64_t i, auto lanes) {
    constexpr int64_t n = decltype(lanes)::kN;
    Vec<n> sum = {}, squares = {};
    for (int64_t p = 0; p < pixels; ++p) {
      const Vec<n> x = Load<n>(v + p * c + i);
      sum += x;
      squares += x * x;
    }
    Store<n>(sums + i, Load<n>(sums + i) + sum);
    Store<n>(sums + c + i, Load<n>(sums + c + i) + squares);
  });
}

// y, and y's moments [2, C] for the norm after the conv: the sums over the batch of y and
// of y * y (XLA's two reductions over y took as long as the rest of a block's forward
// op on B0's first blocks). They are taken over each output row, then over the image's
// rows, then over the images in order, so they do not depend on the threads.
ffi::Error Forward(ffi::ThreadPool& pool, const Geometry& g, const Source& src,
                   ffi::Buffer<ffi::F32>& mean, ffi::Buffer<ffi::F32>& inv,
                   ffi::Buffer<ffi::F32>& scale, ffi::Buffer<ffi::F32>& bias,
                   ffi::Buffer<ffi::F32>& kernel, ffi::ResultBuffer<ffi::F32>& y,
                   ffi::ResultBuffer<ffi::F32>& moments) {
  if (auto e = CheckNorm(g, mean, inv, scale, bias); e.failure()) return e;
  if (moments->element_count() != 2 * g.c) {
    return ffi::Error::InvalidArgument("norm_act_depthwise: want moments [2, C]");
  }
  const std::vector<float> a = NormScale(inv.typed_data(), scale.typed_data(), g.c);
  const float* ks = kernel.typed_data();
  const float *mu = mean.typed_data(), *beta = bias.typed_data();
  float* ys = y->typed_data();
  std::vector<float> partials(g.b * 2 * g.c);  // Each image's moments.
  ParallelFor(pool, g.b, [&](int64_t b) {
    thread_local std::vector<float> buffer, input;
    const int64_t c = g.c, row = g.pad_w * c;
    const float* xb = src.Image(g, b, input);
    float* s = Scratch(buffer, g.pad_h * row);
    Activation(g, xb, mu, a.data(), beta, s);
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      float* out_row = ys + (b * g.out_h + oh) * g.out_w * c;
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        ConvPixel(g, s + (oh * g.stride * g.pad_w + ow * g.stride) * c, ks, out_row + ow * c);
      }
      AddMoments(g.out_w, c, out_row, partials.data() + b * 2 * c);
    }
  });
  SumParts(pool, g.b, 2 * g.c, 2 * g.c, partials.data(), moments->typed_data());
  return ffi::Error::Success();
}

// Given g = dL/dy: dz = dL/dz for z = (x - mean) * a + bias (the norm's output before
// swish), and the kernel gradient and the two sums the norm's backward needs, sum(dz)
// and sum(dz * xhat) with xhat = (x - mean) * inv. The batch is cut into `parts`
// contiguous parts, one task each; each sums over its images into its own partial
// sums, and SumParts adds the parts up in order. Sums are taken over a row first, then
// over rows, then over the part's images, then over the parts, so they do not depend on
// the threads. (XLA summed the parts before: its reduction over a leading axis of
// [32, 25, 1152] took 14 ms, about 0.3 GB/s.)
//
// With the expand conv (src.w), dz itself is not written out: each band of its rows goes
// into the expand conv's gradients at once, dx_a = dz @ (w * a)' [B, H, W, K] (out, in dz's
// place) and x' dz [K, C] (xdz); the terms of those gradients that need the norm's sums
// over the whole batch are left to XLA.
ffi::Error Backward(ffi::ThreadPool& pool, const Geometry& g, const Source& src,
                    ffi::Buffer<ffi::F32>& mean, ffi::Buffer<ffi::F32>& inv,
                    ffi::Buffer<ffi::F32>& scale, ffi::Buffer<ffi::F32>& bias,
                    ffi::Buffer<ffi::F32>& kernel, ffi::Buffer<ffi::F32>& grad,
                    ffi::ResultBuffer<ffi::F32>& out, ffi::ResultBuffer<ffi::F32>& dkernel,
                    ffi::ResultBuffer<ffi::F32>& sums, int64_t parts, float* xdz = nullptr) {
  if (auto e = CheckNorm(g, mean, inv, scale, bias); e.failure()) return e;
  auto gd = grad.dimensions();
  if (gd.size() != 4 || gd[0] != g.b || gd[1] != g.out_h || gd[2] != g.out_w || gd[3] != g.c) {
    return ffi::Error::InvalidArgument("norm_act_depthwise: grad is not [B, H', W', C]");
  }
  const int64_t taps = g.k * g.k * g.c, xdz_size = xdz == nullptr ? 0 : src.k * g.c;
  if (parts < 1 || parts > g.b) {
    return ffi::Error::InvalidArgument("norm_act_depthwise: want 1 <= parts <= B");
  }
  if (dkernel->element_count() != taps || sums->element_count() != 2 * g.c) {
    return ffi::Error::InvalidArgument("norm_act_depthwise: want dkernel [K*K, C], sums [2, C]");
  }
  const std::vector<float> a = NormScale(inv.typed_data(), scale.typed_data(), g.c);
  const float *ks = kernel.typed_data(), *gs = grad.typed_data();
  const float *mu = mean.typed_data(), *in = inv.typed_data(), *beta = bias.typed_data();
  float* outs = out->typed_data();
  // Each part's partial sums: its kernel gradient, sums and x' dz, one after the other.
  const int64_t per_part = taps + 2 * g.c + xdz_size;
  std::vector<float> partials(parts * per_part);
  const float* as = a.data();
  std::vector<float> wa_t;  // (w * a)' [C, K].
  if (src.w != nullptr) {
    wa_t.resize(g.c * src.k);
    for (int64_t i = 0; i < src.k; ++i) {
      for (int64_t ch = 0; ch < g.c; ++ch) wa_t[ch * src.k + i] = src.w[i * g.c + ch] * as[ch];
    }
  }
  ParallelFor(pool, parts, [&](int64_t part) {
    thread_local std::vector<float> buffer, input;
    const int64_t c = g.c, row = g.pad_w * c;
    // With the expand conv, dz goes on into its gradients a band of rows at a time, at
    // least 64 pixels: those small matmuls keep their sums in registers over the band.
    const int64_t band = std::min(g.h, (64 + g.w - 1) / g.w);
    const int64_t band_size = xdz == nullptr ? 0 : band * g.w * c;
    float* s = Scratch(buffer, 2 * g.pad_h * row + 2 * c + band_size);
    float* ds = s + g.pad_h * row;  // dL/ds over the padded grid.
    float* row_sums = ds + g.pad_h * row;
    float* dz_band = row_sums + 2 * c;  // With the expand conv: a band of dz's rows.
    float* dk = partials.data() + part * per_part;  // Zeros: the vector's.
    float* sum_dz = dk + taps;  // Then sum(dz * xhat).
    float* xdz_part = xdz == nullptr ? nullptr : sum_dz + 2 * c;
    for (int64_t b = part * g.b / parts; b < (part + 1) * g.b / parts; ++b) {
      const float* xb = src.Image(g, b, input);
      Activation(g, xb, mu, as, beta, s);
      std::fill(ds, ds + g.pad_h * row, 0.0f);
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        ScatterRow(g, oh, s, ds, gs + (b * g.out_h + oh) * g.out_w * c, ks, dk);
      }
      for (int64_t u0 = 0; u0 < g.h; u0 += band) {
        const int64_t u1 = std::min(g.h, u0 + band);
        const int64_t first = (b * g.h + u0) * g.w;  // The band's first pixel in the batch.
        float* dz = xdz_part == nullptr ? outs + first * c : dz_band;
        for (int64_t u = u0; u < u1; ++u) {
          std::fill(row_sums, row_sums + 2 * c, 0.0f);
          for (int64_t v = 0; v < g.w; ++v) {
            DzPixel(c, xb + (u * g.w + v) * c, ds + ((g.top + u) * g.pad_w + g.left + v) * c,
                    mu, in, as, beta, dz + ((u - u0) * g.w + v) * c, row_sums);
          }
#pragma GCC ivdep
          for (int64_t ch = 0; ch < 2 * c; ++ch) sum_dz[ch] += row_sums[ch];
        }
        if (xdz_part != nullptr) {
          const int64_t pixels = (u1 - u0) * g.w;
          Expand(pixels, c, src.k, dz_band, wa_t.data(), outs + first * src.k);
          AccumulateOuter(pixels, src.k, c, src.x + first * src.k, dz_band, xdz_part);
        }
      }
    }
  });
  SumParts(pool, parts, taps, per_part, partials.data(), dkernel->typed_data());
  SumParts(pool, parts, 2 * g.c, per_part, partials.data() + taps, sums->typed_data());
  if (xdz != nullptr) {
    SumParts(pool, parts, xdz_size, per_part, partials.data() + taps + 2 * g.c, xdz);
  }
  return ffi::Error::Success();
}

ffi::Error NormActDepthwiseForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                   ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> inv,
                                   ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> bias,
                                   ffi::Buffer<ffi::F32> kernel, ffi::ResultBuffer<ffi::F32> y,
                                   ffi::ResultBuffer<ffi::F32> moments, int64_t stride) {
  Geometry g;
  if (auto e = MakeGeometry(x, kernel, stride, &g); e.failure()) return e;
  return Forward(pool, g, Source{x.typed_data()}, mean, inv, scale, bias, kernel, y, moments);
}

ffi::Error NormActDepthwiseBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                    ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> inv,
                                    ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> bias,
                                    ffi::Buffer<ffi::F32> kernel, ffi::Buffer<ffi::F32> grad,
                                    ffi::ResultBuffer<ffi::F32> dz,
                                    ffi::ResultBuffer<ffi::F32> dkernel,
                                    ffi::ResultBuffer<ffi::F32> sums, int64_t stride,
                                    int64_t parts) {
  Geometry g;
  if (auto e = MakeGeometry(x, kernel, stride, &g); e.failure()) return e;
  return Backward(pool, g, Source{x.typed_data()}, mean, inv, scale, bias, kernel, grad, dz,
                  dkernel, sums, parts);
}

// The expanded forms: x [B, H, W, K] and the expand conv's w [K, C] in place of x @ w.
ffi::Error ExpandGeometry(ffi::Buffer<ffi::F32>& x, ffi::Buffer<ffi::F32>& w,
                          ffi::Buffer<ffi::F32>& kernel, int64_t stride, Geometry* g,
                          Source* src) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  if (xd.size() != 4 || wd.size() != 2 || wd[0] != xd[3]) {
    return ffi::Error::InvalidArgument(
        "expand_norm_act_depthwise: want x [B, H, W, K], w [K, C]");
  }
  *src = Source{x.typed_data(), w.typed_data(), xd[3]};
  return MakeGeometry(xd[0], xd[1], xd[2], wd[1], kernel, stride, g);
}

ffi::Error ExpandNormActDepthwiseForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                         ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::F32> mean,
                                         ffi::Buffer<ffi::F32> inv, ffi::Buffer<ffi::F32> scale,
                                         ffi::Buffer<ffi::F32> bias,
                                         ffi::Buffer<ffi::F32> kernel,
                                         ffi::ResultBuffer<ffi::F32> y,
                                         ffi::ResultBuffer<ffi::F32> moments,
                                         int64_t stride) {
  Geometry g;
  Source src{nullptr};
  if (auto e = ExpandGeometry(x, w, kernel, stride, &g, &src); e.failure()) return e;
  return Forward(pool, g, src, mean, inv, scale, bias, kernel, y, moments);
}

ffi::Error ExpandNormActDepthwiseBackward(
    ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
    ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> inv, ffi::Buffer<ffi::F32> scale,
    ffi::Buffer<ffi::F32> bias, ffi::Buffer<ffi::F32> kernel, ffi::Buffer<ffi::F32> grad,
    ffi::ResultBuffer<ffi::F32> dx_a, ffi::ResultBuffer<ffi::F32> xdz,
    ffi::ResultBuffer<ffi::F32> dkernel, ffi::ResultBuffer<ffi::F32> sums, int64_t stride,
    int64_t parts) {
  Geometry g;
  Source src{nullptr};
  if (auto e = ExpandGeometry(x, w, kernel, stride, &g, &src); e.failure()) return e;
  auto xd = xdz->dimensions();
  if (xd.size() != 2 || xd[0] != src.k || xd[1] != g.c) {
    return ffi::Error::InvalidArgument("expand_norm_act_depthwise: xdz is not [K, C]");
  }
  return Backward(pool, g, src, mean, inv, scale, bias, kernel, grad, dx_a, dkernel, sums,
                  parts, xdz->typed_data());
}

// The arguments every op here takes first: the thread pool, the norm's input (x or y)
// and its mean, inv, scale and bias.
auto NormArgs() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()   // x
      .Arg<ffi::Buffer<ffi::F32>>()   // mean
      .Arg<ffi::Buffer<ffi::F32>>()   // inv
      .Arg<ffi::Buffer<ffi::F32>>()   // scale
      .Arg<ffi::Buffer<ffi::F32>>();  // bias
}

// The arguments both directions of the depthwise op take: NormArgs and the kernel.
auto NormActDepthwiseArgs() { return NormArgs().Arg<ffi::Buffer<ffi::F32>>(); }

// ---- Batch norm + swish + squeeze-excite's pool and gate (no conv) ---------------------
// y [B, H, W, C] is the depthwise conv's output; a = swish(z), z = (y - mean) * (inv *
// scale) + bias; gate [B, C] comes from XLA (the squeeze-excite's two small matmuls).
// Each op is one pass over y (and the gradient), parallel over the images; sums over an
// image's pixels are taken over a row first, then over the rows.

// An op's y and norm, checked: y's shape, and the norm's vectors with a = inv * scale.
struct ImageNorm {
  int64_t b, h, w, c;
  const float *y, *mean, *inv, *bias;
  std::vector<float> a;
};

ffi::Error ReadImageNorm(ffi::Buffer<ffi::F32>& y, ffi::Buffer<ffi::F32>& mean,
                         ffi::Buffer<ffi::F32>& inv, ffi::Buffer<ffi::F32>& scale,
                         ffi::Buffer<ffi::F32>& bias, const char* op, ImageNorm* n) {
  const int64_t c = mean.element_count();
  if (y.dimensions().size() != 4 || y.dimensions()[3] != c || inv.element_count() != c ||
      scale.element_count() != c || bias.element_count() != c) {
    return ffi::Error::InvalidArgument(std::string(op) +
                                       ": want y [B, H, W, C], mean, inv, scale, bias [C]");
  }
  auto d = y.dimensions();
  n->b = d[0], n->h = d[1], n->w = d[2], n->c = c;
  n->y = y.typed_data(), n->mean = mean.typed_data(), n->inv = inv.typed_data();
  n->bias = bias.typed_data();
  n->a = NormScale(inv.typed_data(), scale.typed_data(), c);
  return ffi::Error::Success();
}

// pooled[b, c] = mean over the image's pixels of a (the squeeze's input).
ffi::Error SqueezeForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> y,
                          ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> inv,
                          ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> bias,
                          ffi::ResultBuffer<ffi::F32> pooled) {
  ImageNorm n;
  if (auto e = ReadImageNorm(y, mean, inv, scale, bias, "norm_act_squeeze", &n); e.failure()) {
    return e;
  }
  const int64_t b = n.b, h = n.h, w = n.w, c = n.c;
  const float *ys = n.y, *mu = n.mean, *beta = n.bias, *as = n.a.data();
  float* out = pooled->typed_data();
  ParallelFor(pool, b, [&](int64_t image) {
    thread_local std::vector<float> buffer;
    float* row = Scratch(buffer, c);
    float* acc = out + image * c;
    std::fill(acc, acc + c, 0.0f);
    for (int64_t u = 0; u < h; ++u) {
      std::fill(row, row + c, 0.0f);
      for (int64_t v = 0; v < w; ++v) {
        const float* __restrict yp = ys + ((image * h + u) * w + v) * c;
        ForChunks<1>(c, [&](int64_t i, auto lanes) {
          constexpr int64_t n = decltype(lanes)::kN;
          const Vec<n> z = NormZ<n>(i, yp, mu, as, beta);
          Store<n>(row + i, Load<n>(row + i) + z * Sigmoid(z));
        });
      }
      for (int64_t ch = 0; ch < c; ++ch) acc[ch] += row[ch];
    }
    const float pixels = static_cast<float>(h * w);
    for (int64_t ch = 0; ch < c; ++ch) acc[ch] /= pixels;
  });
  return ffi::Error::Success();
}

// out = a * gate[b, c].
ffi::Error ExciteForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> y,
                         ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> inv,
                         ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> bias,
                         ffi::Buffer<ffi::F32> gate, ffi::ResultBuffer<ffi::F32> out) {
  ImageNorm n;
  if (auto e = ReadImageNorm(y, mean, inv, scale, bias, "norm_act_excite", &n); e.failure()) {
    return e;
  }
  const int64_t b = n.b, pixels = n.h * n.w, c = n.c;
  if (gate.element_count() != b * c) {
    return ffi::Error::InvalidArgument("norm_act_excite: want gate [B, C]");
  }
  const float *ys = n.y, *mu = n.mean, *beta = n.bias, *as = n.a.data();
  const float* gs = gate.typed_data();
  float* os = out->typed_data();
  ParallelFor(pool, b, [&](int64_t image) {
    const float* __restrict g = gs + image * c;
    for (int64_t p = 0; p < pixels; ++p) {
      const float* __restrict yp = ys + (image * pixels + p) * c;
      float* __restrict op = os + (image * pixels + p) * c;
      ForChunks<1>(c, [&](int64_t i, auto lanes) {
        constexpr int64_t n = decltype(lanes)::kN;
        const Vec<n> z = NormZ<n>(i, yp, mu, as, beta);
        Store<n>(op + i, z * Sigmoid(z) * Load<n>(g + i));
      });
    }
  });
  return ffi::Error::Success();
}

// The backward's first pass, given dout = dL/dout: per image and channel, sums over its
// pixels of dout * a (the gate's gradient), swish'(z) * dout, swish'(z) * dout * xhat,
// swish'(z) and swish'(z) * xhat: sums [B, 5, C], from which XLA forms the norm's sums.
ffi::Error ExciteSums(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> y, ffi::Buffer<ffi::F32> mean,
                      ffi::Buffer<ffi::F32> inv, ffi::Buffer<ffi::F32> scale,
                      ffi::Buffer<ffi::F32> bias, ffi::Buffer<ffi::F32> dout,
                      ffi::ResultBuffer<ffi::F32> sums) {
  ImageNorm n;
  if (auto e = ReadImageNorm(y, mean, inv, scale, bias, "norm_act_excite_sums", &n);
      e.failure()) {
    return e;
  }
  const int64_t b = n.b, h = n.h, w = n.w, c = n.c;
  if (dout.element_count() != y.element_count() || sums->element_count() != b * 5 * c) {
    return ffi::Error::InvalidArgument("norm_act_excite_sums: want dout like y, sums [B, 5, C]");
  }
  const float *ys = n.y, *mu = n.mean, *in = n.inv, *beta = n.bias, *as = n.a.data();
  const float* ds = dout.typed_data();
  float* ss = sums->typed_data();
  ParallelFor(pool, b, [&](int64_t image) {
    thread_local std::vector<float> buffer;
    float* __restrict row = Scratch(buffer, 5 * c);
    float* acc = ss + image * 5 * c;
    std::fill(acc, acc + 5 * c, 0.0f);
    for (int64_t u = 0; u < h; ++u) {
      std::fill(row, row + 5 * c, 0.0f);
      for (int64_t v = 0; v < w; ++v) {
        const int64_t at = ((image * h + u) * w + v) * c;
        const float* __restrict yp = ys + at;
        const float* __restrict dp = ds + at;
        ForChunks<1>(c, [&](int64_t i, auto lanes) {
          constexpr int64_t n = decltype(lanes)::kN;
          Vec<n> centred;
          const Vec<n> z = NormZ<n>(i, yp, mu, as, beta, &centred);
          const Vec<n> sig = Sigmoid(z), d = Load<n>(dp + i);
          const Vec<n> slope = SwishSlope(z, sig), xhat = centred * Load<n>(in + i);
          const Vec<n> terms[5] = {d * (z * sig), slope * d, slope * d * xhat, slope, slope * xhat};
          for (int64_t t = 0; t < 5; ++t) {
            Store<n>(row + t * c + i, Load<n>(row + t * c + i) + terms[t]);
          }
        });
      }
      for (int64_t ch = 0; ch < 5 * c; ++ch) acc[ch] += row[ch];
    }
  });
  return ffi::Error::Success();
}

// The backward's second pass: dy = a * (dz - k1 - xhat * k2) with dz = swish'(z) *
// (dout * gate + dpool), gate and dpool [B, C] (dpool: the pool's gradient over the
// pixel count), k1 and k2 [C] (the norm's sums over the element count).
ffi::Error ExciteInputGrad(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> y,
                           ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> inv,
                           ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> bias,
                           ffi::Buffer<ffi::F32> dout, ffi::Buffer<ffi::F32> gate,
                           ffi::Buffer<ffi::F32> dpool, ffi::Buffer<ffi::F32> k1,
                           ffi::Buffer<ffi::F32> k2, ffi::ResultBuffer<ffi::F32> dy) {
  ImageNorm n;
  if (auto e = ReadImageNorm(y, mean, inv, scale, bias, "norm_act_excite_grad", &n);
      e.failure()) {
    return e;
  }
  const int64_t b = n.b, pixels = n.h * n.w, c = n.c;
  if (dout.element_count() != y.element_count() || gate.element_count() != b * c ||
      dpool.element_count() != b * c || k1.element_count() != c || k2.element_count() != c) {
    return ffi::Error::InvalidArgument(
        "norm_act_excite_grad: want dout like y, gate and dpool [B, C], k1 and k2 [C]");
  }
  const float *ys = n.y, *mu = n.mean, *in = n.inv, *beta = n.bias, *as = n.a.data();
  const float *ds = dout.typed_data(), *gs = gate.typed_data(), *ps = dpool.typed_data();
  const float *m1 = k1.typed_data(), *m2 = k2.typed_data();
  float* dys = dy->typed_data();
  ParallelFor(pool, b, [&](int64_t image) {
    const float* __restrict g = gs + image * c;
    const float* __restrict dp = ps + image * c;
    for (int64_t p = 0; p < pixels; ++p) {
      const int64_t at = (image * pixels + p) * c;
      const float* __restrict yp = ys + at;
      const float* __restrict dop = ds + at;
      float* __restrict out = dys + at;
      ForChunks<1>(c, [&](int64_t i, auto lanes) {
        constexpr int64_t n = decltype(lanes)::kN;
        Vec<n> centred;
        const Vec<n> z = NormZ<n>(i, yp, mu, as, beta, &centred);
        const Vec<n> dz =
            SwishSlope(z, Sigmoid(z)) * (Load<n>(dop + i) * Load<n>(g + i) + Load<n>(dp + i));
        Store<n>(out + i, Load<n>(as + i) *
                              (dz - Load<n>(m1 + i) - centred * Load<n>(in + i) * Load<n>(m2 + i)));
      });
    }
  });
  return ffi::Error::Success();
}

// x [B, H, W, K], w [K, C], then the norm's vectors and the kernel.
auto ExpandNormActDepthwiseArgs() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()   // x
      .Arg<ffi::Buffer<ffi::F32>>()   // w
      .Arg<ffi::Buffer<ffi::F32>>()   // mean
      .Arg<ffi::Buffer<ffi::F32>>()   // inv
      .Arg<ffi::Buffer<ffi::F32>>()   // scale
      .Arg<ffi::Buffer<ffi::F32>>()   // bias
      .Arg<ffi::Buffer<ffi::F32>>();  // kernel
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MuralNormActDepthwiseForward, NormActDepthwiseForward,
                              NormActDepthwiseArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y
                                  .Ret<ffi::Buffer<ffi::F32>>()  // moments [2, C]
                                  .Attr<int64_t>("stride"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MuralNormActDepthwiseBackward, NormActDepthwiseBackward,
                              NormActDepthwiseArgs()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // grad
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dz
                                  .Ret<ffi::Buffer<ffi::F32>>()  // kernel grads [K*K, C]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // sums [2, C]
                                  .Attr<int64_t>("stride")
                                  .Attr<int64_t>("parts"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MuralExpandNormActDepthwiseForward, ExpandNormActDepthwiseForward,
                              ExpandNormActDepthwiseArgs()
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y
                                  .Ret<ffi::Buffer<ffi::F32>>()  // moments [2, C]
                                  .Attr<int64_t>("stride"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MuralExpandNormActDepthwiseBackward, ExpandNormActDepthwiseBackward,
                              ExpandNormActDepthwiseArgs()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // grad
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dz @ (w * a)' [B, H, W, K]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // x' dz [K, C]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // kernel grads [K*K, C]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // sums [2, C]
                                  .Attr<int64_t>("stride")
                                  .Attr<int64_t>("parts"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MuralSqueezeForward, SqueezeForward,
                              NormArgs().Ret<ffi::Buffer<ffi::F32>>());  // pooled [B, C]

XLA_FFI_DEFINE_HANDLER_SYMBOL(MuralExciteForward, ExciteForward,
                              NormArgs()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // gate [B, C]
                                  .Ret<ffi::Buffer<ffi::F32>>());  // out

XLA_FFI_DEFINE_HANDLER_SYMBOL(MuralExciteSums, ExciteSums,
                              NormArgs()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // dout
                                  .Ret<ffi::Buffer<ffi::F32>>());  // sums [B, 5, C]

XLA_FFI_DEFINE_HANDLER_SYMBOL(MuralExciteInputGrad, ExciteInputGrad,
                              NormArgs()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // dout
                                  .Arg<ffi::Buffer<ffi::F32>>()    // gate [B, C]
                                  .Arg<ffi::Buffer<ffi::F32>>()    // dpool [B, C]
                                  .Arg<ffi::Buffer<ffi::F32>>()    // k1 [C]
                                  .Arg<ffi::Buffer<ffi::F32>>()    // k2 [C]
                                  .Ret<ffi::Buffer<ffi::F32>>());  // dy
