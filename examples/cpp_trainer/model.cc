#include "model.h"

#include <algorithm>
#include <cmath>

namespace cpp_trainer {

Weights random_weights(uint32_t seed) {
  std::mt19937 rng(seed);
  Weights w;
  for (const Layer& l : kLayers) {
    std::normal_distribution<float> n(0.0F, 1.0F / std::sqrt(static_cast<float>(l.in)));
    std::vector<float> p(layer_params(l));
    for (float& x : p) x = n(rng);
    std::fill(p.end() - l.out, p.end(), 0.0F);
    w.push_back(std::move(p));
  }
  return w;
}

void forward_layer(const Layer& l, const float* w, const float* b, bool last, int n,
                   const std::vector<float>& x, std::vector<float>& y) {
  y.assign(static_cast<size_t>(n) * l.out, 0.0F);
  for (int s = 0; s < n; ++s) {
    for (int o = 0; o < l.out; ++o) {
      float acc = b[o];
      const float* row = w + static_cast<size_t>(o) * l.in;
      for (int i = 0; i < l.in; ++i) acc += row[i] * x[static_cast<size_t>(s) * l.in + i];
      y[static_cast<size_t>(s) * l.out + o] = last ? acc : std::tanh(acc);
    }
  }
}

void backward_layer(const Layer& l, const float* w, bool last, int n, const std::vector<float>& x,
                    const std::vector<float>& y, std::vector<float> dy, float* gw, float* gb,
                    std::vector<float>& dx) {
  if (!last) {
    for (size_t k = 0; k < dy.size(); ++k) dy[k] *= 1.0F - y[k] * y[k];
  }
  std::fill(gw, gw + weight_count(l), 0.0F);
  std::fill(gb, gb + l.out, 0.0F);
  dx.assign(static_cast<size_t>(n) * l.in, 0.0F);
  for (int s = 0; s < n; ++s) {
    for (int o = 0; o < l.out; ++o) {
      const float d = dy[static_cast<size_t>(s) * l.out + o];
      gb[o] += d;
      const float* row = w + static_cast<size_t>(o) * l.in;
      float* grow = gw + static_cast<size_t>(o) * l.in;
      for (int i = 0; i < l.in; ++i) {
        grow[i] += d * x[static_cast<size_t>(s) * l.in + i];
        dx[static_cast<size_t>(s) * l.in + i] += d * row[i];
      }
    }
  }
}

Batch make_batch(std::mt19937& rng, const Weights& teacher) {
  std::normal_distribution<float> n(0.0F, 1.0F);
  Batch b;
  b.x.resize(static_cast<size_t>(kBatch) * kLayers[0].in);
  for (float& v : b.x) v = n(rng);
  std::vector<float> act = b.x, next;
  for (int k = 0; k < kDepth; ++k) {
    const float* p = teacher[k].data();
    forward_layer(kLayers[k], p, p + weight_count(kLayers[k]), k == kDepth - 1, kBatch, act, next);
    act.swap(next);
  }
  b.y = act;
  return b;
}

Batch slice(const Batch& b, int first, int n) {
  const size_t in = kLayers[0].in;
  const size_t out = kLayers[kDepth - 1].out;
  Batch s;
  s.x.assign(b.x.begin() + static_cast<ptrdiff_t>(first * in),
             b.x.begin() + static_cast<ptrdiff_t>((first + n) * in));
  s.y.assign(b.y.begin() + static_cast<ptrdiff_t>(first * out),
             b.y.begin() + static_cast<ptrdiff_t>((first + n) * out));
  return s;
}

double squared_error_and_grad(const std::vector<float>& out, const std::vector<float>& y,
                              float denominator, std::vector<float>& dout) {
  dout.resize(out.size());
  double sum = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    const float e = out[k] - y[k];
    sum += static_cast<double>(e) * e;
    dout[k] = 2.0F * e / denominator;
  }
  return sum;
}

InMemory::InMemory(Weights init, float lr_, float wd_) : w(std::move(init)), lr(lr_), wd(wd_) {
  for (auto& p : w) {
    m.emplace_back(p.size(), 0.0F);
    v.emplace_back(p.size(), 0.0F);
  }
}

float InMemory::step(const Batch& b) {
  std::vector<std::vector<float>> acts = {b.x};
  for (int k = 0; k < kDepth; ++k) {
    std::vector<float> y;
    const float* p = w[k].data();
    forward_layer(kLayers[k], p, p + weight_count(kLayers[k]), k == kDepth - 1, kBatch, acts.back(),
                  y);
    acts.push_back(std::move(y));
  }
  std::vector<float> dy;
  const size_t outputs = acts.back().size();
  const float loss =
      static_cast<float>(squared_error_and_grad(acts.back(), b.y, static_cast<float>(outputs), dy) /
                         static_cast<double>(outputs));
  ++t;
  const double bc1 = 1 - std::pow(0.9, static_cast<double>(t));
  const double bc2 = 1 - std::pow(0.999, static_cast<double>(t));
  for (int k = kDepth - 1; k >= 0; --k) {
    const Layer& l = kLayers[k];
    std::vector<float> g(layer_params(l)), dx;
    backward_layer(l, w[k].data(), k == kDepth - 1, kBatch, acts[k], acts[k + 1], dy, g.data(),
                   g.data() + weight_count(l), dx);
    for (size_t i = 0; i < g.size(); ++i) {
      float p = w[k][i] * (1.0F - lr * wd);
      m[k][i] = 0.9F * m[k][i] + 0.1F * g[i];
      v[k][i] = 0.999F * v[k][i] + 0.001F * g[i] * g[i];
      const double denom = std::sqrt(static_cast<double>(v[k][i])) / std::sqrt(bc2) + 1e-8;
      w[k][i] = p - static_cast<float>(lr / bc1 * m[k][i] / denom);
    }
    dy.swap(dx);
  }
  return loss;
}

}  // namespace cpp_trainer
