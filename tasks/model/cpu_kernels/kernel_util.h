// Helpers shared by bertflow's CPU kernels: bfloat16 <-> float in plain integer code (so loops
// vectorize), and running a loop body over the device's intra-op threads.
#ifndef BERTFLOW_KERNEL_UTIL_H_
#define BERTFLOW_KERNEL_UTIL_H_

#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/util/work_sharder.h"

// Every hot loop is compiled three times (AVX-512, AVX2, baseline x86-64); the loader picks the
// best one for the CPU it runs on, so one build serves any x86-64 worker.
#define BERTFLOW_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))

namespace bertflow {

// A float's bits and back (memcpy: the defined way, and it compiles to nothing). Loops that
// clamp or mask with integer operations on them, not branches, vectorize in every clone.
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T> struct Storage { using type = float; };
template <> struct Storage<tensorflow::bfloat16> { using type = uint16_t; };

inline float load(float v) { return v; }
inline float load(uint16_t v) { return float_of(uint32_t(v) << 16); }
inline void store(float* p, float v) { *p = v; }
// Round to nearest even, as TensorFlow's float -> bfloat16 cast does; NaN stays NaN.
inline void store(uint16_t* p, float v) {
  const uint32_t u = bits_of(v);
  *p = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40)
                                        : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <typename T>
const typename Storage<T>::type* data(const tensorflow::Tensor& t) {
  return reinterpret_cast<const typename Storage<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename Storage<T>::type* data(tensorflow::Tensor* t) {
  return reinterpret_cast<typename Storage<T>::type*>(t->flat<T>().data());
}

// Runs fn(begin, end) over [0, n) on the intra-op threads; cost is per unit, in cycles.
template <typename Fn>
void parallel_for(tensorflow::OpKernelContext* ctx, int64_t n, int64_t cost, Fn fn) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(pool->num_threads, pool->workers, n, cost, fn);
}

}  // namespace bertflow

#define BERTFLOW_REGISTER_FLOAT_AND_BF16(OP, KERNEL)                                      \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name(OP).Device(tensorflow::DEVICE_CPU).TypeConstraint<float>("T"), KERNEL<float>); \
  REGISTER_KERNEL_BUILDER(Name(OP)                                                        \
                              .Device(tensorflow::DEVICE_CPU)                             \
                              .TypeConstraint<tensorflow::bfloat16>("T"),                 \
                          KERNEL<tensorflow::bfloat16>)

#endif  // BERTFLOW_KERNEL_UTIL_H_
