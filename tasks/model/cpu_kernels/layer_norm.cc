// Layer normalisation over the last axis, statistics in float32, and its gradient.
//
// tf_keras' LayerNormalization under mixed precision is about a dozen ops forward (casts,
// moments, batch_normalization) and more backward; here each direction is one pass per row.
// gamma and beta stay float32 (the variables' dtype); x, y, dy and dx have the layer's dtype.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using namespace tensorflow;

REGISTER_OP("BertflowLayerNorm")
    .Input("x: T")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: T")
    .Output("mean: float")  // per row, for the gradient
    .Output("rstd: float")  // 1 / sqrt(variance + epsilon), per row
    .Attr("T: {float, bfloat16}")
    .Attr("epsilon: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Vector(c->UnknownDim()));
      return OkStatus();
    });

REGISTER_OP("BertflowLayerNormGrad")
    .Input("dy: T")
    .Input("x: T")
    .Input("gamma: float")
    .Input("mean: float")
    .Input("rstd: float")
    .Output("dx: T")
    .Output("dgamma: float")
    .Output("dbeta: float")
    .Attr("T: {float, bfloat16}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(2));
      return OkStatus();
    });

namespace {

template <typename S>
BERTFLOW_CLONES void forward_row(S* __restrict y, const S* __restrict x,
                                 const float* __restrict gamma, const float* __restrict beta,
                                 int64_t w, float epsilon, float* mean_out, float* rstd_out) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < w; ++i) sum += bertflow::load(x[i]);
  const float mean = sum / w;
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < w; ++i) {
    const float d = bertflow::load(x[i]) - mean;
    squares += d * d;
  }
  const float rstd = 1.0f / std::sqrt(squares / w + epsilon);
  for (int64_t i = 0; i < w; ++i)
    bertflow::store(y + i, (bertflow::load(x[i]) - mean) * rstd * gamma[i] + beta[i]);
  *mean_out = mean;
  *rstd_out = rstd;
}

// dx = rstd * (dy*gamma - mean(dy*gamma) - xhat * mean(dy*gamma*xhat)); dgamma and dbeta
// are accumulated into the caller's per-thread sums.
template <typename S>
BERTFLOW_CLONES void backward_row(S* __restrict dx, const S* __restrict dy, const S* __restrict x,
                                  const float* __restrict gamma, int64_t w, float mean, float rstd,
                                  float* __restrict dgamma, float* __restrict dbeta) {
  float a = 0.f, c = 0.f;
#pragma omp simd reduction(+ : a, c)
  for (int64_t i = 0; i < w; ++i) {
    const float xhat = (bertflow::load(x[i]) - mean) * rstd, d = bertflow::load(dy[i]);
    a += d * gamma[i];
    c += d * gamma[i] * xhat;
    dgamma[i] += d * xhat;
    dbeta[i] += d;
  }
  a /= w;
  c /= w;
  for (int64_t i = 0; i < w; ++i) {
    const float xhat = (bertflow::load(x[i]) - mean) * rstd;
    bertflow::store(dx + i, rstd * (bertflow::load(dy[i]) * gamma[i] - a - xhat * c));
  }
}

Status CheckShapes(const Tensor& x, const Tensor& gamma, int64_t* width, int64_t* rows) {
  if (x.dims() < 1 || x.dim_size(x.dims() - 1) == 0)
    return errors::InvalidArgument("BertflowLayerNorm: x needs a non-empty last axis");
  *width = x.dim_size(x.dims() - 1);
  *rows = x.NumElements() / *width;
  if (gamma.NumElements() != *width)
    return errors::InvalidArgument("BertflowLayerNorm: gamma has ", gamma.NumElements(),
                                   " values for a last axis of ", *width);
  return OkStatus();
}

template <typename T>
class LayerNormOp : public OpKernel {
 public:
  explicit LayerNormOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("epsilon", &epsilon_));
  }
  void Compute(OpKernelContext* ctx) override {
    using S = typename bertflow::Storage<T>::type;
    const Tensor& x = ctx->input(0);
    int64_t w, rows;
    OP_REQUIRES_OK(ctx, CheckShapes(x, ctx->input(1), &w, &rows));
    OP_REQUIRES(ctx, ctx->input(2).NumElements() == w,
                errors::InvalidArgument("BertflowLayerNorm: beta and gamma differ in size"));
    Tensor *y, *mean, *rstd;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({rows}), &mean));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({rows}), &rstd));
    const S* px = bertflow::data<T>(x);
    S* py = bertflow::data<T>(y);
    const float* gamma = ctx->input(1).flat<float>().data();
    const float* beta = ctx->input(2).flat<float>().data();
    float* pm = mean->flat<float>().data();
    float* pr = rstd->flat<float>().data();
    bertflow::parallel_for(ctx, rows, 6 * w, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        forward_row<S>(py + r * w, px + r * w, gamma, beta, w, epsilon_, pm + r, pr + r);
    });
  }

 private:
  float epsilon_;
};

template <typename T>
class LayerNormGradOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    using S = typename bertflow::Storage<T>::type;
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(1);
    int64_t w, rows;
    OP_REQUIRES_OK(ctx, CheckShapes(x, ctx->input(2), &w, &rows));
    OP_REQUIRES(ctx, dy.shape() == x.shape() && ctx->input(3).NumElements() == rows &&
                         ctx->input(4).NumElements() == rows,
                errors::InvalidArgument("BertflowLayerNormGrad: inputs differ in shape"));
    Tensor *dx, *dgamma, *dbeta;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({w}), &dgamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({w}), &dbeta));
    const S* pdy = bertflow::data<T>(dy);
    const S* px = bertflow::data<T>(x);
    S* pdx = bertflow::data<T>(dx);
    const float* gamma = ctx->input(2).flat<float>().data();
    const float* pm = ctx->input(3).flat<float>().data();
    const float* pr = ctx->input(4).flat<float>().data();
    float* out_g = dgamma->flat<float>().data();
    float* out_b = dbeta->flat<float>().data();
    // dgamma and dbeta sum over every row. Each block of kRowsPerBlock rows sums its rows in
    // order into its own slot; the slots are then added in block order. Blocks, not the
    // threads' shards: the shards depend on the thread count, and shards added as they
    // finish (as this kernel once did, under a mutex) summed in a different order from one
    // call to the next, so two runs with one seed ended with different weights (issue 34).
    // The result is now the same bits on every call and for any number of threads, always:
    // it costs one extra pass over rows / kRowsPerBlock partial sums, so the `deterministic`
    // Param needs no other kernel for it.
    constexpr int64_t kRowsPerBlock = 32;
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    std::vector<float> partial(blocks * 2 * w, 0.f);  // block k: [g(w), b(w)]
    bertflow::parallel_for(ctx, blocks, 10 * w * kRowsPerBlock, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        float* g = partial.data() + k * 2 * w;
        const int64_t r1 = std::min(rows, (k + 1) * kRowsPerBlock);
        for (int64_t r = k * kRowsPerBlock; r < r1; ++r)
          backward_row<S>(pdx + r * w, pdy + r * w, px + r * w, gamma, w, pm[r], pr[r], g,
                          g + w);
      }
    });
    std::fill(out_g, out_g + w, 0.f);
    std::fill(out_b, out_b + w, 0.f);
    for (int64_t k = 0; k < blocks; ++k) {
      const float* g = partial.data() + k * 2 * w;
      for (int64_t i = 0; i < w; ++i) {
        out_g[i] += g[i];
        out_b[i] += g[w + i];
      }
    }
  }
};

BERTFLOW_REGISTER_FLOAT_AND_BF16("BertflowLayerNorm", LayerNormOp);
BERTFLOW_REGISTER_FLOAT_AND_BF16("BertflowLayerNormGrad", LayerNormGradOp);

}  // namespace
