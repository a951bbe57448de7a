#include "runtime/cpu/matmul.h"

#include <tuple>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cpu/primitive_cache.h"

namespace tandem::cpu {
namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, bool, bool, float, bool, bool>;

Key MakeKey(const MatmulShape& s, bool bf16, bool bf16_out) {
  return Key(s.batch, s.m, s.n, s.k, s.trans_a, s.trans_b, s.lda, s.ldb, s.ldc, s.batch_stride_a,
             s.batch_stride_b, s.batch_stride_c, s.bias, s.accumulate, s.alpha, bf16, bf16_out);
}

struct Entry {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias;
};

// bf16: A and B are bfloat16, C and the bias stay f32 (the products accumulate
// in f32); bf16_out: C is bfloat16 too (the f32 sums rounded once).
Entry Create(const MatmulShape& s, bool bf16, bool bf16_out) {
  const int64_t lda = s.lda ? s.lda : (s.trans_a ? s.m : s.k);
  const int64_t ldb = s.ldb ? s.ldb : (s.trans_b ? s.k : s.n);
  const int64_t ldc = s.ldc ? s.ldc : s.n;
  const int64_t bsa = s.batch_stride_a ? s.batch_stride_a : s.m * s.k;
  const int64_t bsb = s.batch_stride_b ? s.batch_stride_b : s.k * s.n;
  const int64_t bsc = s.batch_stride_c ? s.batch_stride_c : s.m * s.n;
  // op(A) is m x k: element (i, p) sits at i*lda + p, or p*lda + i when transposed.
  const dnnl::memory::dims a_strides =
      s.trans_a ? dnnl::memory::dims{bsa, 1, lda} : dnnl::memory::dims{bsa, lda, 1};
  const dnnl::memory::dims b_strides =
      s.trans_b ? dnnl::memory::dims{bsb, 1, ldb} : dnnl::memory::dims{bsb, ldb, 1};
  const auto in_type = bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  Entry e;
  e.a = dnnl::memory::desc({s.batch, s.m, s.k}, in_type, a_strides);
  e.b = dnnl::memory::desc({s.batch, s.k, s.n}, in_type, b_strides);
  e.c = bf16_out ? dnnl::memory::desc({s.batch, s.m, s.n}, dnnl::memory::data_type::bf16,
                                      dnnl::memory::dims{bsc, ldc, 1})
                 : StridedF32({s.batch, s.m, s.n}, {bsc, ldc, 1});
  if (s.bias) e.bias = StridedF32({1, 1, s.n}, {s.n, s.n, 1});
  dnnl::primitive_attr attr = UserScratchpad();
  if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::desc desc =
      s.bias ? dnnl::matmul::desc(e.a, e.b, e.bias, e.c) : dnnl::matmul::desc(e.a, e.b, e.c);
  e.pd = dnnl::matmul::primitive_desc(desc, attr, CpuEngine());
  e.prim = dnnl::matmul(e.pd);
  return e;
}

// Entries are never evicted: a model has a handful of shapes per batch size.
using MatmulCache = PrimitiveCache<Entry, Key>;

const Entry& Get(const MatmulShape& s, bool bf16, bool bf16_out = false) {
  static const auto* cache = new MatmulCache();
  return cache->Get(MakeKey(s, bf16, bf16_out), [&] { return Create(s, bf16, bf16_out); });
}

void Run(const Entry& e, const MatmulShape& shape, const void* a, const void* b, void* c,
         const float* bias) {
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, Wrap(e.a, a)}, {DNNL_ARG_WEIGHTS, Wrap(e.b, b)}, {DNNL_ARG_DST, Wrap(e.c, c)}};
  if (shape.bias) args.emplace(DNNL_ARG_BIAS, Wrap(e.bias, bias));
  Execute(e.prim, args);
}

}  // namespace

void Matmul(const MatmulShape& shape, const float* a, const float* b, float* c, const float* bias) {
  Run(Get(shape, /*bf16=*/false), shape, a, b, c, bias);
}

void MatmulBf16(const MatmulShape& shape, const uint16_t* a, const uint16_t* b, float* c,
                const float* bias) {
  Run(Get(shape, /*bf16=*/true), shape, a, b, c, bias);
}

void MatmulBf16ToBf16(const MatmulShape& shape, const uint16_t* a, const uint16_t* b, uint16_t* c,
                      const float* bias) {
  Run(Get(shape, /*bf16=*/true, /*bf16_out=*/true), shape, a, b, c, bias);
}

namespace {

// Elements an operand of `rows` x `cols` (after op) spans, with its row and
// batch strides: what must be widened for the fp32 product to read it.
int64_t Extent(int64_t batch, int64_t batch_stride, int64_t rows, int64_t cols, int64_t ld) {
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  return (batch - 1) * batch_stride + (rows - 1) * ld + cols;
}

}  // namespace

void MatmulF16(const MatmulShape& s, const uint16_t* a, const uint16_t* b, float* c,
               const float* bias) {
  // A is m x k after op: stored k x m when transposed. B is k x n likewise.
  const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  const int64_t lda = s.lda ? s.lda : a_cols, ldb = s.ldb ? s.ldb : b_cols;
  const int64_t bsa = s.batch_stride_a ? s.batch_stride_a : s.m * s.k;
  const int64_t bsb = s.batch_stride_b ? s.batch_stride_b : s.k * s.n;
  const int64_t na = Extent(s.batch, bsa, a_rows, a_cols, lda);
  const int64_t nb = Extent(s.batch, bsb, b_rows, b_cols, ldb);
  // Kept per calling thread and grown, not allocated (and zeroed) per product.
  thread_local std::vector<float> widened;
  if (static_cast<int64_t>(widened.size()) < na + nb) widened.resize(na + nb);
  FromF16(a, widened.data(), na);
  FromF16(b, widened.data() + na, nb);
  Matmul(s, widened.data(), widened.data() + na, c, bias);
}

std::string MatmulImplementation(const MatmulShape& shape, bool bf16) {
  return Get(shape, bf16).pd.impl_info_str();
}

}  // namespace tandem::cpu
