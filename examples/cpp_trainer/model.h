// cpp_trainer's model and its maths, on the host: an MLP (16 -> 256 -> 256 -> 256 -> 4, tanh)
// that learns a fixed random "teacher" MLP by mean squared error, and the same MLP trained all in
// memory with AdamW (torch semantics) as the reference the strata runs are checked against.
#pragma once

#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

namespace cpp_trainer {

struct Layer {
  int in, out;
};
inline constexpr Layer kLayers[] = {{16, 256}, {256, 256}, {256, 256}, {256, 4}};
inline constexpr int kDepth = static_cast<int>(std::size(kLayers));
inline constexpr int kBatch = 64;  // samples per (global) step

// One layer's weights and bias, flat: W is out x in, then b.
inline uint64_t weight_count(const Layer& l) { return static_cast<uint64_t>(l.in) * l.out; }
inline uint64_t layer_params(const Layer& l) { return weight_count(l) + l.out; }

using Weights = std::vector<std::vector<float>>;  // per layer, flat [W; b]

Weights random_weights(uint32_t seed);

// Forward through one layer for `n` samples: y = W x + b, tanh except on the last layer.
void forward_layer(const Layer& l, const float* w, const float* b, bool last, int n,
                   const std::vector<float>& x, std::vector<float>& y);

// Given dL/dy (after the activation) for `n` samples, writes the layer's gradient into `gw`
// (out x in) and `gb` (out), which it zeroes first, and dL/dx into `dx`.
void backward_layer(const Layer& l, const float* w, bool last, int n, const std::vector<float>& x,
                    const std::vector<float>& y, std::vector<float> dy, float* gw, float* gb,
                    std::vector<float>& dx);

// A batch: inputs and the teacher's outputs, kBatch samples.
struct Batch {
  std::vector<float> x, y;
};
Batch make_batch(std::mt19937& rng, const Weights& teacher);
// Samples [first, first + n) of a batch.
Batch slice(const Batch& b, int first, int n);

// The squared error summed over `out`, and dL/dout = 2 e / `denominator` for each element: the
// denominator is the number of outputs whose mean the loss is (kBatch x 4 for the global mean),
// divided by the number of ranks whose gradients are averaged.
double squared_error_and_grad(const std::vector<float>& out, const std::vector<float>& y,
                              float denominator, std::vector<float>& dout);

// The all-in-memory reference: the same model and the same AdamW, on the whole batch.
struct InMemory {
  Weights w, m, v;
  float lr, wd;
  uint64_t t = 0;
  InMemory(Weights init, float lr_, float wd_);
  float step(const Batch& b);  // returns the loss before the update
};

}  // namespace cpp_trainer
