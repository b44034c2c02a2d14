// Shared by the C API's ZeRO tests (c_api_zero_test.cc, one process; c_api_zero_ranks_test.cc,
// every rank of a strata-run job): one-rank communicators on a port of their own, a small model,
// and gradients written through the engine.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "c_api_fixtures.h"
#include "strata/strata.h"

namespace strata::testing {

// A TCP port of the loopback interface that was free a moment ago.
inline uint16_t free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
  close(fd);
  REQUIRE(ok);
  return ntohs(addr.sin_port);
}

// A job of one rank whatever the environment says, with its rendezvous on a free port (so that
// tests running at once do not meet on MASTER_PORT's default).
inline strata_status_t make_solo_comm(strata_runtime_t* runtime, strata_communicator_t** out) {
  const std::string port = std::to_string(free_port());
  const strata_setting_t settings[] = {{"RANK", nullptr},
                                       {"WORLD_SIZE", nullptr},
                                       {"LOCAL_RANK", nullptr},
                                       {"MASTER_ADDR", "127.0.0.1"},
                                       {"MASTER_PORT", port.c_str()},
                                       {"STRATA_COMM_BACKEND", "gloo"},
                                       {"STRATA_COMM_TIMEOUT", "60s"}};
  return strata_communicator_create(runtime, settings, sizeof(settings) / sizeof(settings[0]), out);
}

// The parameters of the tests: a matrix, a vector and a scalar, with initial values.
struct TinyModel {
  std::vector<std::string> names = {"layer.weight", "layer.bias", "scale"};
  std::vector<std::vector<int64_t>> shapes = {{3, 5}, {7}, {}};
  std::vector<std::vector<float>> initial;

  TinyModel() {
    for (size_t p = 0; p < names.size(); ++p) {
      std::vector<float> values(count(p));
      for (size_t i = 0; i < values.size(); ++i) {
        values[i] = 0.25F * std::sin(static_cast<float>(7 * p + i + 1));
      }
      initial.push_back(std::move(values));
    }
  }
  size_t count(size_t p) const {
    size_t n = 1;
    for (int64_t d : shapes[p]) n *= static_cast<size_t>(d);
    return n;
  }
  std::vector<strata_zero_param_spec_t> specs() const {
    std::vector<strata_zero_param_spec_t> out;
    for (size_t p = 0; p < names.size(); ++p) {
      out.push_back(strata_zero_param_spec_t{names[p].c_str(), shapes[p].data(), shapes[p].size(),
                                             0, initial[p].data()});
    }
    return out;
  }
};

// fp32 parameters and gradients, small groups and alignment: several groups, every rank a slice.
inline strata_zero_options_t tiny_options(uint32_t stage) {
  strata_zero_options_t options;
  REQUIRE_OK(strata_zero_options_init(&options));
  options.stage = stage;
  options.param_type = STRATA_PARAM_F32;
  options.grad_type = STRATA_GRAD_F32;
  options.bucket_bytes = 16 * 4;  // 16 fp32 gradients a group
  options.alignment = 4;
  options.param_home = STRATA_TIER_CPU;
  // Stage 3: the scalar (4 bytes) stays whole on every rank, the others are partitioned.
  options.persist_below_bytes = 8;
  options.optimizer.defaults.lr = 0.01F;
  options.optimizer.defaults.weight_decay = 0.01F;
  return options;
}

// Adds `g` into the parameter's gradient buffer (fp32) and marks it ready.
inline void add_grad(strata_zero_engine_t* engine, strata_zero_param_t p, strata_stream_t* stream,
                     const std::vector<float>& g) {
  void* buffer = nullptr;
  REQUIRE_OK(strata_zero_engine_acquire_grad(engine, p, STRATA_TIER_CPU, stream, &buffer));
  REQUIRE_OK(strata_stream_synchronize(stream));
  auto* b = static_cast<float*>(buffer);
  for (size_t i = 0; i < g.size(); ++i) b[i] += g[i];
  REQUIRE_OK(strata_zero_engine_grad_ready(engine, p, stream));
}

// The parameter's fp32 value as the model sees it.
inline std::vector<float> read_param(strata_zero_engine_t* engine, strata_zero_param_t p,
                                     strata_stream_t* stream, size_t count) {
  void* data = nullptr;
  REQUIRE_OK(strata_zero_engine_acquire_param(engine, p, STRATA_TIER_CPU, stream,
                                              STRATA_ACCESS_READ, &data));
  REQUIRE_OK(strata_stream_synchronize(stream));
  std::vector<float> out(count);
  std::memcpy(out.data(), data, count * sizeof(float));
  REQUIRE_OK(strata_zero_engine_release_param(engine, p, stream));
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace strata::testing
