// The exact (erf) GELU and its gradient, computed in float32 whatever the tensor's dtype.
//
// Under mixed_bfloat16, TensorFlow's GELU is a chain of element-wise ops, each a pass over
// memory, with a slow bfloat16 Erfc; here the forward and the backward are one pass each.
// erf is Eigen's float rational approximation (clamped to [-4, 4]), exp a Cephes-style
// polynomial: the results agree with tf.nn.gelu to about 1e-6 absolute.
#include "kernel_util.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

using namespace tensorflow;

REGISTER_OP("BertflowGelu")
    .Input("x: T")
    .Output("y: T")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(shape_inference::UnchangedShape);

REGISTER_OP("BertflowGeluGrad")
    .Input("dy: T")
    .Input("x: T")
    .Output("dx: T")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(shape_inference::UnchangedShape);

namespace {

// The loops below vectorize only without branches: GCC turns a float clamp such as
// `x < -4 ? -4 : x` into a jump (and then specialises the clamped path), which only AVX-512's
// masked instructions could if-convert, so the AVX2 and baseline clones ran one element at a
// time. The clamps are integer minima on the bit patterns instead, and rounding is the
// 1.5 * 2^23 trick instead of a nearbyint call: the same results, in every clone's vectors.
inline uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }

inline float erf_f(float x) {
  // x clamped to [-4, 4]: |x|'s bits are ordered as |x| is (NaN clamps too; GELU's factor v
  // keeps it NaN). 0x40800000 is 4.0f.
  const uint32_t u = bertflow::bits_of(x);
  x = bertflow::float_of(umin(u & 0x7fffffffu, 0x40800000u) | (u & 0x80000000u));
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return x * p / q;
}

// exp(x) for x <= 0: x = n ln2 + r, exp(r) by polynomial, times 2^n.
inline float exp_nonpositive(float x) {
  // max(x, -87): for x <= 0 the bits grow with |x|; 0xC2AE0000 is -87.0f.
  x = bertflow::float_of(umin(bertflow::bits_of(x), 0xC2AE0000u));
  // Round to nearest even, as nearbyint does: exact for |t| < 2^22 (here |t| <= 126).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * bertflow::float_of(uint32_t(int32_t(n) + 127) << 23);
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

template <typename S>
BERTFLOW_CLONES void gelu(S* __restrict y, const S* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = bertflow::load(x[i]);
    bertflow::store(y + i, 0.5f * v * (1.0f + erf_f(v * kInvSqrt2)));
  }
}

// d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
template <typename S>
BERTFLOW_CLONES void gelu_grad(S* __restrict dx, const S* __restrict dy, const S* __restrict x,
                               int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = bertflow::load(x[i]);
    const float cdf = 0.5f * (1.0f + erf_f(v * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * exp_nonpositive(-0.5f * v * v);
    bertflow::store(dx + i, bertflow::load(dy[i]) * (cdf + v * pdf));
  }
}

template <typename T>
class GeluOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    using S = typename bertflow::Storage<T>::type;
    const Tensor& x = ctx->input(0);
    Tensor* y;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    const S* px = bertflow::data<T>(x);
    S* py = bertflow::data<T>(y);
    bertflow::parallel_for(ctx, x.NumElements(), 40,
                           [&](int64_t a, int64_t b) { gelu<S>(py + a, px + a, b - a); });
  }
};

template <typename T>
class GeluGradOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    using S = typename bertflow::Storage<T>::type;
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(1);
    OP_REQUIRES(ctx, dy.shape() == x.shape(), errors::InvalidArgument("dy and x differ in shape"));
    Tensor* dx;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    const S* pd = bertflow::data<T>(dy);
    const S* px = bertflow::data<T>(x);
    S* po = bertflow::data<T>(dx);
    bertflow::parallel_for(ctx, x.NumElements(), 60, [&](int64_t a, int64_t b) {
      gelu_grad<S>(po + a, pd + a, px + a, b - a);
    });
  }
};

BERTFLOW_REGISTER_FLOAT_AND_BF16("BertflowGelu", GeluOp);
BERTFLOW_REGISTER_FLOAT_AND_BF16("BertflowGeluGrad", GeluGradOp);

}  // namespace
