// AdamW in one pass over a variable and its two moments.
//
// torch.optim.AdamW's rule, the one tasks.model.AdamW applies with TensorFlow's kernels in two
// passes (decay, then ResourceApplyAdam):
//   var *= 1 - lr * weight_decay
//   m += (g - m) * (1 - beta1);  v += (g * g - v) * (1 - beta2)
//   var -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon)
// Memory traffic decides the speed: one pass reads var, m, v, g and writes var, m, v once.
// g is first multiplied by grad_scale: tf.clip_by_global_norm's factor (1 without clipping),
// applied here as each gradient is read instead of in a pass of its own that writes a
// scaled copy of every gradient.
// A sparse gradient (embedding rows, repeats summed) takes the dense rule: every row of the
// table is swept, and rows without a gradient still decay and move by their moments.
#include <vector>

#include "kernel_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

using namespace tensorflow;

REGISTER_OP("BertflowApplyAdamW")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("grad: float")      // dense: var's shape; sparse: [len(indices), row width]
    .Input("indices: int32")   // sparse only: the row of each grad row (may repeat)
    .Input("coefficients: float")  // [lr_t, 1 - beta1, 1 - beta2, epsilon, lr * weight_decay]
    .Input("grad_scale: float")    // scalar: each gradient is multiplied by it first
    .Attr("sparse: bool = false")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext*) { return OkStatus(); });

namespace {

struct Coefficients {
  float lr_t, one_minus_b1, one_minus_b2, epsilon, keep;
};

BERTFLOW_CLONES
void sweep(float* __restrict var, float* __restrict m, float* __restrict v,
           const float* __restrict g, int64_t n, Coefficients c, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g ? g[i] * scale : 0.0f;
    const float mi = m[i] + (gi - m[i]) * c.one_minus_b1;
    const float vi = v[i] + (gi * gi - v[i]) * c.one_minus_b2;
    m[i] = mi;
    v[i] = vi;
    var[i] = var[i] * c.keep - mi * c.lr_t / (std::sqrt(vi) + c.epsilon);
  }
}

// Updates in place, unless a reader still holds the buffer: then, as TensorFlow's own
// training kernels do, the variable gets a private copy first.
Status MakeWritable(OpKernelContext* ctx, Var* var) {
  Tensor* t = var->tensor();
  if (t->dtype() != DT_FLOAT) return errors::InvalidArgument("BertflowApplyAdamW: float32 only");
  if (!var->copy_on_read_mode.load() && t->RefCountIsOne()) return OkStatus();
  Tensor copy;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_FLOAT, t->shape(), &copy));
  std::memcpy(copy.data(), t->data(), t->TotalBytes());
  *t = copy;
  return OkStatus();
}

class ApplyAdamWOp : public OpKernel {
 public:
  explicit ApplyAdamWOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("sparse", &sparse_));
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Var> var, m, v;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 1), &m));
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 2), &v));
    mutex_lock lock_var(*var->mu()), lock_m(*m->mu()), lock_v(*v->mu());
    for (Var* x : {var.get(), m.get(), v.get()}) OP_REQUIRES_OK(ctx, MakeWritable(ctx, x));
    const int64_t n = var->tensor()->NumElements();
    OP_REQUIRES(ctx, m->tensor()->NumElements() == n && v->tensor()->NumElements() == n,
                errors::InvalidArgument("BertflowApplyAdamW: var, m and v differ in size"));
    auto co = ctx->input(5).flat<float>();
    OP_REQUIRES(ctx, co.size() == 5, errors::InvalidArgument("5 coefficients expected"));
    const Coefficients c{co(0), co(1), co(2), co(3), 1.0f - co(4)};
    const Tensor& scale_t = ctx->input(6);
    OP_REQUIRES(ctx, scale_t.NumElements() == 1,
                errors::InvalidArgument("BertflowApplyAdamW: grad_scale is one number"));
    const float scale = scale_t.flat<float>()(0);
    float* pvar = var->tensor()->flat<float>().data();
    float* pm = m->tensor()->flat<float>().data();
    float* pv = v->tensor()->flat<float>().data();
    const Tensor& grad = ctx->input(3);
    const float* pg = grad.flat<float>().data();

    if (!sparse_) {
      OP_REQUIRES(ctx, grad.NumElements() == n,
                  errors::InvalidArgument("BertflowApplyAdamW: grad and var differ in size"));
      bertflow::parallel_for(ctx, n, 16, [&](int64_t a, int64_t b) {
        sweep(pvar + a, pm + a, pv + a, pg + a, b - a, c, scale);
      });
      return;
    }
    OP_REQUIRES(ctx, var->tensor()->dims() >= 1 && var->tensor()->dim_size(0) > 0,
                errors::InvalidArgument("BertflowApplyAdamW: sparse needs a table"));
    const int64_t rows = var->tensor()->dim_size(0), width = n / rows;
    auto idx = ctx->input(4).flat<int32>();
    const int64_t k = idx.size();
    OP_REQUIRES(ctx, grad.NumElements() == k * width,
                errors::InvalidArgument("BertflowApplyAdamW: grad rows != indices"));
    // Sum repeated rows, each scaled as clip_by_global_norm scales the slices' values, into
    // a compact buffer; slot[r] is row r's place in it, or -1.
    std::vector<int64_t> slot(rows, -1);
    std::vector<float> summed;
    summed.reserve(k * width);
    for (int64_t j = 0; j < k; ++j) {
      const int32 r = idx(j);
      OP_REQUIRES(ctx, r >= 0 && r < rows,
                  errors::InvalidArgument("BertflowApplyAdamW: index ", r, " not in [0, ", rows, ")"));
      const float* src = pg + j * width;
      if (slot[r] < 0) {
        slot[r] = summed.size() / width;
        summed.resize(summed.size() + width, 0.0f);
      }
      float* dst = summed.data() + slot[r] * width;
      for (int64_t q = 0; q < width; ++q) dst[q] += src[q] * scale;
    }
    bertflow::parallel_for(ctx, rows, 16 * width, [&](int64_t a, int64_t b) {
      for (int64_t r = a; r < b; ++r) {
        const float* g = slot[r] < 0 ? nullptr : summed.data() + slot[r] * width;
        sweep(pvar + r * width, pm + r * width, pv + r * width, g, width, c, 1.0f);
      }
    });
  }

 private:
  bool sparse_;
};

REGISTER_KERNEL_BUILDER(Name("BertflowApplyAdamW").Device(DEVICE_CPU), ApplyAdamWOp);

}  // namespace
