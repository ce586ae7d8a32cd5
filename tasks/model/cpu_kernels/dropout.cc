// Dropout with its random draws in the same pass: y = x * keep / (1 - rate).
//
// TensorFlow's dropout is four ops (Philox RandomUniform, GreaterEqual, Mul, SelectV2) plus
// two in the backward pass. Here the keep mask comes from a counter-based hash of
// (seed, element index) (SplitMix64's finalizer), is written out as bytes for the gradient,
// and the backward pass is one multiply by it.
#include "kernel_util.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

using namespace tensorflow;

REGISTER_OP("BertflowDropout")
    .Input("x: T")
    .Input("seed: int64")  // any values; a fresh pair per call
    .Input("rate: float")
    .Output("y: T")
    .Output("keep: uint8")
    .Attr("T: {float, bfloat16}")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      return OkStatus();
    });

REGISTER_OP("BertflowDropoutGrad")
    .Input("dy: T")
    .Input("keep: uint8")
    .Input("rate: float")
    .Output("dx: T")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn(shape_inference::UnchangedShape);

namespace {

inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

BERTFLOW_CLONES
void draw(uint8_t* __restrict keep, int64_t begin, int64_t end, uint64_t seed,
          uint32_t threshold) {
  for (int64_t i = begin; i < end; ++i)
    keep[i] = uint32_t(mix(seed + uint64_t(i) * 0x9E3779B97F4A7C15ULL) >> 32) >= threshold;
}

template <typename S>
BERTFLOW_CLONES void masked_scale(S* __restrict y, const S* __restrict x,
                                  const uint8_t* __restrict keep, int64_t n, float scale) {
  // keep[i] ? v : 0 as a bit mask, not a branch: only then do the AVX2 and baseline clones
  // vectorize (a dropped NaN or inf still gives 0).
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t v = bertflow::bits_of(bertflow::load(x[i]) * scale);
    bertflow::store(y + i, bertflow::float_of(v & (0u - uint32_t(keep[i]))));
  }
}

Status GetScale(OpKernelContext* ctx, int input, float* rate, float* scale) {
  *rate = ctx->input(input).scalar<float>()();
  if (!(*rate >= 0.0f && *rate < 1.0f))
    return errors::InvalidArgument("dropout rate must be in [0, 1), got ", *rate);
  *scale = 1.0f / (1.0f - *rate);
  return OkStatus();
}

template <typename T>
class DropoutOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    using S = typename bertflow::Storage<T>::type;
    const Tensor& x = ctx->input(0);
    float rate, scale;
    OP_REQUIRES_OK(ctx, GetScale(ctx, 2, &rate, &scale));
    auto seed = ctx->input(1).flat<int64_t>();
    OP_REQUIRES(ctx, seed.size() == 2, errors::InvalidArgument("seed must have 2 values"));
    Tensor *y, *keep;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, x.shape(), &keep));
    const uint64_t s = mix(uint64_t(seed(0)) ^ mix(uint64_t(seed(1)) + 1));
    const uint32_t threshold = uint32_t(double(rate) * 4294967296.0);
    const S* px = bertflow::data<T>(x);
    S* py = bertflow::data<T>(y);
    uint8_t* pk = keep->flat<uint8_t>().data();
    bertflow::parallel_for(ctx, x.NumElements(), 8, [&](int64_t a, int64_t b) {
      draw(pk, a, b, s, threshold);
      masked_scale<S>(py + a, px + a, pk + a, b - a, scale);
    });
  }
};

template <typename T>
class DropoutGradOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    using S = typename bertflow::Storage<T>::type;
    const Tensor& dy = ctx->input(0);
    const Tensor& keep = ctx->input(1);
    OP_REQUIRES(ctx, keep.NumElements() == dy.NumElements(),
                errors::InvalidArgument("dy and keep differ in size"));
    float rate, scale;
    OP_REQUIRES_OK(ctx, GetScale(ctx, 2, &rate, &scale));
    Tensor* dx;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, dy.shape(), &dx));
    const S* pd = bertflow::data<T>(dy);
    S* px = bertflow::data<T>(dx);
    const uint8_t* pk = keep.flat<uint8_t>().data();
    bertflow::parallel_for(ctx, dy.NumElements(), 4, [&](int64_t a, int64_t b) {
      masked_scale<S>(px + a, pd + a, pk + a, b - a, scale);
    });
  }
};

BERTFLOW_REGISTER_FLOAT_AND_BF16("BertflowDropout", DropoutOp);
BERTFLOW_REGISTER_FLOAT_AND_BF16("BertflowDropoutGrad", DropoutGradOp);

}  // namespace
