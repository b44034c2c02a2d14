// Optimizer checkpoints: a directory with a state file (per parameter: master, exp_avg,
// exp_avg_sq as little-endian fp32) and a text manifest naming it, with step counts,
// hyper-parameters (hex floats: exact), the loss scale and an XXH3-64 checksum per parameter.
//
// Crash safety: the state file gets a fresh name and is fsynced before the manifest is
// replaced by rename(); a crash at any point leaves either the old or the new checkpoint
// complete. Old state files are removed only after the new manifest is durable.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>

#include "optimizer_impl.h"
#include "strata/base/mutex.h"
#include "strata/base/unique_fd.h"
#include "strata/optimizer/checkpoint_io.h"
#include "strata/optimizer/checkpoint_manifest.h"

namespace strata {
namespace {

constexpr const char* kManifest = "optimizer.manifest";
constexpr ManifestFormat kFormat{.name = "strata-optimizer-checkpoint",
                                 .version = 1,
                                 .what = "checkpoint",
                                 .writer = "strata's OffloadOptimizer::save()"};

struct ManifestParam {
  std::string name;
  uint64_t count = 0;
  int param_type = 0;
  int grad_type = 0;
  uint64_t steps = 0;
  uint32_t group = 0;
  uint64_t offset = 0;  // bytes into the state file
  uint64_t checksum = 0;
};

struct Manifest {
  uint64_t step = 0;
  float loss_scale = 1.0F;
  uint64_t good_steps = 0;
  std::string state_file;
  std::vector<AdamGroup> groups;
  std::vector<ManifestParam> params;
};

std::string render(const Manifest& m) {
  ManifestWriter out(kFormat);
  out.add("step", m.step);
  out.add("loss_scale", m.loss_scale, m.good_steps);
  out.add("state_file", m.state_file);
  for (const AdamGroup& g : m.groups) add_adam_group(out, "group", g);
  for (const ManifestParam& p : m.params) {
    out.add("param", p.count, p.param_type, p.grad_type, p.steps, p.group, p.offset,
            ManifestHex{p.checksum}, p.name);  // the name last: it may contain spaces
  }
  return std::move(out).finish();
}

absl::StatusOr<Manifest> parse(const std::string& text, const std::string& path) {
  using Count = ManifestReader::Count;
  Manifest m;
  ManifestReader reader(kFormat, path);
  reader.on("step", 1, 1, Count::kOptional,
            [&](const ManifestLine& l) { return l.get(0, &m.step); });
  reader.on("loss_scale", 2, 2, Count::kOptional, [&](const ManifestLine& l) {
    return l.get(0, &m.loss_scale) && l.get(1, &m.good_steps);
  });
  reader.on("state_file", 1, 1, Count::kRequired, [&](const ManifestLine& l) {
    m.state_file = std::string(l.field(0));
    return !m.state_file.empty() && m.state_file.find('/') == std::string::npos;
  });
  read_adam_groups(reader, "group", &m.groups);
  // param <count> <param type> <grad type> <steps> <group> <offset> <checksum> <name>
  reader.on("param", 8, SIZE_MAX, Count::kRepeated, [&](const ManifestLine& l) {
    ManifestParam p;
    ManifestHex checksum;
    if (!l.get(0, &p.count) || !l.get(1, &p.param_type) || !l.get(2, &p.grad_type) ||
        !l.get(3, &p.steps) || !l.get(4, &p.group) || !l.get(5, &p.offset) ||
        !l.get(6, &checksum) || !l.rest(7, &p.name)) {
      return false;
    }
    p.checksum = checksum.value;
    m.params.push_back(std::move(p));
    return true;
  });
  if (auto st = reader.read(text); !st.ok()) return st;
  return m;
}

}  // namespace

absl::Status OffloadOptimizer::save(const std::string& directory) {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  // The checkpoint holds the last step's states, not a step in progress.
  if (auto st = s.roll_back_early(/*rearm=*/true); !st.ok()) return st;
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint: cannot create directory ", directory, ": ", ec.message()));
  }
  Manifest m;
  std::vector<Impl::Param> params = s.params_snapshot();
  {
    MutexLock lock(&s.state_mu);
    m.step = s.step_count;
    m.loss_scale = s.loss_scale;
    m.good_steps = s.good_steps;
    m.groups = s.groups;
  }
  std::random_device random;
  m.state_file = absl::StrFormat("optimizer-%d-%08x.state", m.step, random());
  const std::string state_path = (std::filesystem::path(directory) / m.state_file).string();
  {
    UniqueFd fd(open(state_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) return io_error("creating", state_path, errno);
    uint64_t offset = 0;
    absl::Status status;
    for (const Impl::Param& p : params) {
      std::vector<float> arrays(3 * p.count);
      status = s.read_param_state(p, arrays.data(), arrays.data() + p.count,
                                  arrays.data() + 2 * p.count);
      if (!status.ok()) break;
      const uint64_t bytes = arrays.size() * sizeof(float);
      status = write_all(fd.get(), arrays.data(), bytes, offset, state_path);
      if (!status.ok()) break;
      m.params.push_back(ManifestParam{p.name, p.count, static_cast<int>(p.param_type),
                                       static_cast<int>(p.grad_type), p.steps, p.group, offset,
                                       XXH3_64bits(arrays.data(), bytes)});
      offset += bytes;
    }
    if (status.ok() && fsync(fd.get()) != 0) status = io_error("syncing", state_path, errno);
    if (!status.ok()) {
      unlink(state_path.c_str());
      return status;
    }
  }
  const std::string manifest_path = (std::filesystem::path(directory) / kManifest).string();
  if (auto st = replace_file(directory, manifest_path, render(m)); !st.ok()) {
    unlink(state_path.c_str());
    return st;
  }
  // The new checkpoint is durable: older state files are garbage now.
  for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (name != m.state_file && name.starts_with("optimizer-") && name.ends_with(".state")) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::load(const std::string& directory) {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  if (auto st = s.roll_back_early(/*rearm=*/false); !st.ok()) return st;
  const Impl::Rearm rearm{s};  // with the loaded step counts
  const std::string manifest_path = (std::filesystem::path(directory) / kManifest).string();
  auto text = read_manifest_file(kFormat, manifest_path);
  if (!text.ok()) return text.status();
  auto m = parse(*text, manifest_path);
  if (!m.ok()) return m.status();
  std::vector<Impl::Param> params = s.params_snapshot();
  size_t registered_groups;
  {
    MutexLock lock(&s.state_mu);
    registered_groups = s.groups.size();
  }
  auto mismatch = [&](std::string why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", directory, " does not match this optimizer: ", why,
        "; register the same parameters (names, counts, dtypes, order) and groups before load()"));
  };
  if (m->params.size() != params.size()) {
    return mismatch(absl::StrFormat("it has %d parameters, %d are registered", m->params.size(),
                                    params.size()));
  }
  if (m->groups.size() != registered_groups) {
    return mismatch(absl::StrFormat("it has %d parameter groups, %d exist", m->groups.size(),
                                    registered_groups));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ManifestParam& mp = m->params[i];
    const Impl::Param& p = params[i];
    if (mp.name != p.name || mp.count != p.count ||
        mp.param_type != static_cast<int>(p.param_type) ||
        mp.grad_type != static_cast<int>(p.grad_type) || mp.group != p.group) {
      return mismatch(absl::StrFormat("parameter %d is '%s' (%d elements) there, '%s' (%d) here", i,
                                      mp.name, mp.count, p.name, p.count));
    }
  }
  // Read and verify everything before changing anything.
  const std::string state_path = (std::filesystem::path(directory) / m->state_file).string();
  UniqueFd fd(open(state_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return io_error("opening", state_path, errno);
  std::vector<std::vector<float>> states(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    states[i].resize(3 * params[i].count);
    const uint64_t bytes = states[i].size() * sizeof(float);
    if (auto st = read_all(fd.get(), states[i].data(), bytes, m->params[i].offset, state_path);
        !st.ok()) {
      return st;
    }
    if (XXH3_64bits(states[i].data(), bytes) != m->params[i].checksum) {
      return absl::DataLossError(absl::StrCat("checkpoint: the state of '", params[i].name, "' in ",
                                              state_path,
                                              " fails its checksum; the file is damaged"));
    }
  }
  if (s.options.state_home == TierKind::kCpu) {
    TensorStore& store = s.runtime.store();
    for (size_t i = 0; i < params.size(); ++i) {
      const Impl::Param& p = params[i];
      const TensorHandle tensors[3] = {p.master, p.exp_avg, p.exp_avg_sq};
      for (int a = 0; a < 3; ++a) {
        auto data = store.acquire(tensors[a], TierKind::kCpu, *s.h2d_stream, AccessMode::kWrite);
        if (!data.ok()) return data.status();
        std::memcpy(*data, states[i].data() + a * p.count, p.count * sizeof(float));
        if (auto st = store.release(tensors[a], *s.h2d_stream); !st.ok()) return st;
      }
    }
  } else {
    // Into every chunk's other slot, committed only when all are written.
    uint64_t chunk_count;
    {
      MutexLock lock(&s.state_mu);
      chunk_count = s.chunks.size();
    }
    StagingPool::Lease lease = s.pool->acquire();
    auto* base = static_cast<float*>(lease.data());
    std::vector<uint64_t> written;
    for (uint64_t c = 0; c < chunk_count; ++c) {
      const uint64_t stride = s.chunk_stride(c);
      std::memset(base, 0, s.chunk_state_bytes(c));
      for (const Piece& piece : s.chunk_pieces(c, params, nullptr)) {
        const Impl::Param& p = params[piece.param];
        for (uint64_t a = 0; a < 3; ++a) {
          std::memcpy(base + a * stride + piece.chunk_offset,
                      states[piece.param].data() + a * p.count + piece.offset,
                      piece.count * sizeof(float));
        }
      }
      Completion done;
      absl::Status st = s.write_chunk(c, s.current_slot(c) ^ 1U, base, done);
      st = st.ok() ? done.wait() : st;
      if (!st.ok()) {
        return absl::Status(st.code(),
                            absl::StrCat("checkpoint: loading ", directory, ": ", st.message(),
                                         "; the optimizer's state is unchanged"));
      }
      written.push_back(c);
    }
    s.commit_slots(written);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (auto st = s.write_param_tensor(params[i], 0, states[i].data(), params[i].count); !st.ok()) {
      return st;
    }
  }
  {
    MutexLock lock(&s.state_mu);
    for (size_t i = 0; i < params.size(); ++i) s.params[i].steps = m->params[i].steps;
    s.groups = m->groups;
    s.step_count = m->step;
    s.loss_scale = m->loss_scale;
    s.good_steps = m->good_steps;
  }
  s.wait_for_landings();
  MutexLock lock(&s.landing_mu);
  for (Impl::Landing& l : s.landings) l = Impl::Landing();
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::write_state(ParamId param, std::span<const float> master,
                                           std::span<const float> exp_avg,
                                           std::span<const float> exp_avg_sq,
                                           uint64_t param_steps) {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  if (auto st = s.roll_back_early(/*rearm=*/false); !st.ok()) return st;
  const Impl::Rearm rearm{s};  // with the written step count
  auto p = s.param_copy(param);
  if (!p.ok()) return p.status();
  for (auto [span, what] : {std::pair{master, "master"}, std::pair{exp_avg, "exp_avg"},
                            std::pair{exp_avg_sq, "exp_avg_sq"}}) {
    if (span.size() != p->count) {
      return absl::InvalidArgumentError(
          absl::StrFormat("write_state(%s): %s holds %d values; the parameter has %d", p->name,
                          what, span.size(), p->count));
    }
  }
  const float* sources[3] = {master.data(), exp_avg.data(), exp_avg_sq.data()};
  if (s.options.state_home == TierKind::kCpu) {
    TensorStore& store = s.runtime.store();
    const TensorHandle tensors[3] = {p->master, p->exp_avg, p->exp_avg_sq};
    for (int a = 0; a < 3; ++a) {
      auto data = store.acquire(tensors[a], TierKind::kCpu, *s.h2d_stream, AccessMode::kWrite);
      if (!data.ok()) return data.status();
      std::memcpy(*data, sources[a], p->count * sizeof(float));
      if (auto st = store.release(tensors[a], *s.h2d_stream); !st.ok()) return st;
    }
  } else {
    // Read-modify-write of every chunk the parameter touches, into the chunk's other slot.
    StagingPool::Lease lease = s.pool->acquire();
    auto* base = static_cast<float*>(lease.data());
    const uint64_t e = s.chunk_elements;
    const uint64_t first = p->flat_offset / e;
    const uint64_t last = (p->flat_offset + p->count - 1) / e;
    for (uint64_t c = first; c <= last; ++c) {
      Completion read;
      absl::Status st = s.read_chunk(c, s.current_slot(c), base, read);
      st = st.ok() ? read.wait() : st;
      const uint64_t chunk_begin = c * e;
      const uint64_t begin = std::max(chunk_begin, p->flat_offset);
      const uint64_t end = std::min(chunk_begin + e, p->flat_offset + p->count);
      const uint64_t stride = s.chunk_stride(c);
      for (uint64_t a = 0; a < 3 && st.ok(); ++a) {
        std::memcpy(base + a * stride + (begin - chunk_begin),
                    sources[a] + (begin - p->flat_offset), (end - begin) * sizeof(float));
      }
      Completion written;
      if (st.ok()) st = s.write_chunk(c, s.current_slot(c) ^ 1U, base, written);
      st = st.ok() ? written.wait() : st;
      if (!st.ok()) {
        return absl::Status(st.code(), absl::StrCat("write_state(", p->name, "): ", st.message(),
                                                    c == first ? "; the state is unchanged"
                                                               : "; the state is partly "
                                                                 "written: write it again"));
      }
      s.commit_slots({c});
    }
  }
  if (auto st = s.write_param_tensor(*p, 0, master.data(), p->count); !st.ok()) return st;
  MutexLock lock(&s.state_mu);
  s.params[param.index].steps = param_steps;
  return absl::OkStatus();
}

OffloadOptimizer::ScalerState OffloadOptimizer::scaler_state() const {
  MutexLock lock(&impl_->state_mu);
  return ScalerState{impl_->step_count, impl_->loss_scale, impl_->good_steps};
}

absl::Status OffloadOptimizer::set_scaler_state(const ScalerState& state) {
  if (!(state.loss_scale > 0) || !std::isfinite(state.loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("set_scaler_state: loss scale ", state.loss_scale, " must be finite and > 0"));
  }
  MutexLock lock(&impl_->state_mu);
  impl_->step_count = state.step;
  impl_->loss_scale = state.loss_scale;
  impl_->good_steps = state.good_steps;
  return absl::OkStatus();
}

}  // namespace strata
