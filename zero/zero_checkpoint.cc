// ZeRO checkpoints. save(): every rank writes its slices ([master | exp_avg | exp_avg_sq] of each
// group, one record per group) to its own file, fsynced; the ranks exchange the records'
// checksums; rank 0 writes the manifest (the layout's inputs, the checksums, the counters) and
// replaces the old one by rename(), so a crash leaves the old or the new checkpoint complete.
// load(): rebuilds the writer's layout from the manifest, maps every element of this rank's new
// slices to the writer's rank, group and offset, verifies every record it will read, agrees with
// the other ranks that all verified, and only then installs the states and gathers the
// parameters. World size, group size and alignment may all differ: the mapping is by parameter.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>

#include "strata/base/mutex.h"
#include "strata/base/unique_fd.h"
#include "strata/optimizer/checkpoint_io.h"
#include "zero_engine_impl.h"
#include "zero_manifest.h"

namespace strata {
namespace {

std::string join(const std::string& directory, const std::string& name) {
  return (std::filesystem::path(directory) / name).string();
}

// Whether every rank succeeded at a local part of a collective operation: an all-gather of
// one flag per rank, so that every rank can name the ones that failed. Returns the failed ranks.
absl::StatusOr<std::vector<uint32_t>> failed_ranks(Communicator& comm, bool ok) {
  const int64_t flag = ok ? 0 : 1;
  std::vector<int64_t> flags(static_cast<size_t>(comm.size()));
  auto work = comm.all_gather(&flag, flags.data(), 1, DataType::kInt64);
  if (!work.ok()) return work.status();
  if (auto st = (*work)->wait(); !st.ok()) return st;
  std::vector<uint32_t> failed;
  for (uint32_t r = 0; r < flags.size(); ++r) {
    if (flags[r] != 0) failed.push_back(r);
  }
  return failed;
}

std::string rank_list(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (uint32_t r : ranks) absl::StrAppend(&out, out.empty() ? "" : ", ", r);
  return out;
}

// One group's record in a rank file: 3 × shard floats.
uint64_t record_offset(const ZeroLayout& layout, uint32_t group) {
  uint64_t offset = 0;
  for (uint32_t g = 0; g < group; ++g) offset += 3 * layout.groups()[g].shard * sizeof(float);
  return offset;
}

// Reads the records of a writer's layout, verifying each against the manifest's checksum; the
// last one read is kept, as consecutive pieces mostly come from the same record.
class RecordReader {
 public:
  RecordReader(const std::string& directory, const ZeroManifest& manifest, const ZeroLayout& layout)
      : directory_(directory), manifest_(manifest), layout_(layout) {}

  absl::StatusOr<const std::vector<float>*> read(uint32_t rank, uint32_t group) {
    if (loaded_ && rank == rank_ && group == group_) return &record_;
    const std::string path = join(directory_, manifest_.rank_file(rank));
    UniqueFd& fd = fds_[rank];
    if (!fd) {
      fd = UniqueFd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd) return io_error("opening", path, errno);
    }
    const uint64_t shard = layout_.groups()[group].shard;
    record_.resize(3 * shard);
    loaded_ = false;
    const uint64_t bytes = record_.size() * sizeof(float);
    if (auto st = read_all(fd.get(), record_.data(), bytes, record_offset(layout_, group), path);
        !st.ok()) {
      return st;
    }
    if (group >= manifest_.checksums[rank].size() ||
        XXH3_64bits(record_.data(), bytes) != manifest_.checksums[rank][group]) {
      return absl::DataLossError(absl::StrFormat(
          "ZeRO checkpoint: group %d of %s fails its checksum; the file is damaged", group, path));
    }
    loaded_ = true;
    rank_ = rank;
    group_ = group;
    return &record_;
  }

 private:
  const std::string& directory_;
  const ZeroManifest& manifest_;
  const ZeroLayout& layout_;
  std::map<uint32_t, UniqueFd> fds_;
  std::vector<float> record_;
  bool loaded_ = false;
  uint32_t rank_ = 0;
  uint32_t group_ = 0;
};

// A run of this rank's new slice and where the writer kept it.
struct SourcePiece {
  uint64_t slice_offset = 0;  // in the new slice
  uint32_t rank = 0;          // the writer's
  uint32_t group = 0;
  uint64_t record_offset = 0;  // elements into the record's arrays
  uint64_t count = 0;
};

std::vector<SourcePiece> sources_of(const ZeroLayout& now, uint32_t rank, uint32_t group,
                                    const ZeroLayout& then) {
  std::vector<SourcePiece> out;
  const uint64_t slice_begin = static_cast<uint64_t>(rank) * now.groups()[group].shard;
  for (const ZeroSegment& seg : now.slice_segments(group, rank)) {
    const ZeroSegment& old = then.param_segment(seg.param);
    const uint64_t old_shard = then.groups()[old.group].shard;
    for (uint64_t done = 0; done < seg.count;) {
      const uint64_t at = old.group_offset + seg.param_offset + done;  // in the old group
      SourcePiece p;
      p.slice_offset = seg.group_offset - slice_begin + done;
      p.rank = static_cast<uint32_t>(at / old_shard);
      p.group = old.group;
      p.record_offset = at % old_shard;
      p.count = std::min(seg.count - done, old_shard - p.record_offset);
      out.push_back(p);
      done += p.count;
    }
  }
  return out;
}

}  // namespace

absl::Status ZeroEngine::save(const std::string& directory) {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  s.wait_for_reductions();
  if (auto st = s.failure(); !st.ok()) return st;
  Communicator& comm = s.comm;
  const uint32_t group_count = static_cast<uint32_t>(s.groups.size());

  ZeroManifest m;
  m.ranks = s.ranks;
  m.group_elements = s.layout.max_group_elements();
  m.alignment = s.layout.alignment();
  m.stage = s.options.stage;
  const OffloadOptimizer::ScalerState scaler = s.optimizer->scaler_state();
  m.step = scaler.step;
  m.loss_scale = scaler.loss_scale;
  m.good_steps = scaler.good_steps;
  m.shard_steps = s.optimizer->param_step_count(s.groups[0].shard);
  for (uint32_t g = 0; g < s.options.groups.size(); ++g) {
    auto hyper = s.optimizer->group(g);
    if (!hyper.ok()) return hyper.status();
    m.groups.push_back(*hyper);
  }
  m.params = s.layout.params();
  // One name for this checkpoint's files, chosen by rank 0.
  int64_t nonce = 0;
  if (s.rank == 0)
    nonce = static_cast<int64_t>(std::random_device{}() * 0x100000000ULL ^ std::random_device{}());
  {
    auto work = comm.broadcast(&nonce, 1, DataType::kInt64, 0);
    if (!work.ok()) return s.fail(work.status());
    if (auto st = (*work)->wait(); !st.ok()) return s.fail(st);
  }
  m.nonce = static_cast<uint64_t>(nonce);

  // This rank's file: one record per group.
  std::vector<int64_t> sums(group_count, 0);
  const std::string path = join(directory, m.rank_file(s.rank));
  absl::Status local;
  {
    std::error_code ec;
    std::filesystem::create_directories(directory, ec);
    UniqueFd fd(ec ? -1 : open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (ec) {
      local = absl::FailedPreconditionError(
          absl::StrCat("ZeRO checkpoint: cannot create directory ", directory, ": ", ec.message()));
    } else if (!fd) {
      local = io_error("creating", path, errno);
    }
    uint64_t offset = 0;
    for (uint32_t g = 0; g < group_count && local.ok(); ++g) {
      const uint64_t shard = s.layout.groups()[g].shard;
      std::vector<float> record(3 * shard);
      local = s.optimizer->read_state(s.groups[g].shard, std::span<float>(record).subspan(0, shard),
                                      std::span<float>(record).subspan(shard, shard),
                                      std::span<float>(record).subspan(2 * shard, shard));
      const uint64_t bytes = record.size() * sizeof(float);
      if (local.ok()) local = write_all(fd.get(), record.data(), bytes, offset, path);
      sums[g] = static_cast<int64_t>(XXH3_64bits(record.data(), bytes));
      offset += bytes;
    }
    if (local.ok() && fsync(fd.get()) != 0) local = io_error("syncing", path, errno);
  }
  auto failed = failed_ranks(comm, local.ok());
  if (!failed.ok()) return s.fail(failed.status());
  if (!failed->empty()) {
    unlink(path.c_str());
    return absl::Status(
        local.ok() ? absl::StatusCode::kAborted : local.code(),
        absl::StrCat("ZeroEngine::save(", directory, "): rank(s) ", rank_list(*failed),
                     " could not write their part", local.ok() ? "" : ": ", local.message(),
                     "; the previous checkpoint there (if any) is unchanged"));
  }
  // Rank 0 names every record's checksum in the manifest.
  std::vector<int64_t> all_sums(static_cast<size_t>(group_count) * s.ranks);
  {
    auto work = comm.all_gather(sums.data(), all_sums.data(), group_count, DataType::kInt64);
    if (!work.ok()) return s.fail(work.status());
    if (auto st = (*work)->wait(); !st.ok()) return s.fail(st);
  }
  m.checksums.assign(s.ranks, std::vector<uint64_t>(group_count));
  for (uint32_t r = 0; r < s.ranks; ++r) {
    for (uint32_t g = 0; g < group_count; ++g) {
      m.checksums[r][g] = static_cast<uint64_t>(all_sums[r * group_count + g]);
    }
  }
  if (s.rank == 0) {
    local = replace_file(directory, join(directory, kZeroManifestName), render(m));
    if (local.ok()) {
      // The new checkpoint is durable: the files of older ones are garbage now.
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.starts_with("zero-") && name.ends_with(".state") &&
            !name.starts_with(absl::StrFormat("zero-%016x-", m.nonce))) {
          std::filesystem::remove(entry.path(), ec);
        }
      }
    }
  }
  failed = failed_ranks(comm, local.ok());
  if (!failed.ok()) return s.fail(failed.status());
  if (!failed->empty()) {
    unlink(path.c_str());
    return absl::Status(
        local.ok() ? absl::StatusCode::kAborted : local.code(),
        absl::StrCat("ZeroEngine::save(", directory, "): rank 0 could not write the manifest",
                     local.ok() ? "" : ": ", local.message(),
                     "; the previous checkpoint there (if any) is unchanged"));
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::load(const std::string& directory) {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  s.wait_for_reductions();
  if (auto st = s.failure(); !st.ok()) return st;
  if (s.options.stage == 3) {
    // Gathered copies would be stale once the shards change (every rank drops them alike).
    if (auto st = s.drop_all_gathered("load()"); !st.ok()) {
      return st.code() == absl::StatusCode::kFailedPrecondition ? st : s.fail(st);
    }
  }
  const std::string manifest_path = join(directory, kZeroManifestName);

  // Read, compare and verify locally; then agree.
  absl::StatusOr<ZeroManifest> m = read_zero_manifest(manifest_path);
  absl::Status local = m.status();
  auto mismatch = [&](std::string why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ZeRO checkpoint ", directory, " is not of this model: ", why,
        "; create the engine with the same parameters (names, shapes, groups, order) as the one "
        "that saved it"));
  };
  const auto& params = s.layout.params();
  if (local.ok() && m->params.size() != params.size()) {
    local = mismatch(
        absl::StrFormat("it has %d parameters, this engine %d", m->params.size(), params.size()));
  }
  for (size_t i = 0; local.ok() && i < params.size(); ++i) {
    const ZeroLayoutParam& a = m->params[i];
    const ZeroLayoutParam& b = params[i];
    if (a.name != b.name || a.shape != b.shape || a.adam_group != b.adam_group) {
      local = mismatch(absl::StrFormat(
          "parameter %d is '%s' of %d elements (group %d) there, '%s' of %d (group %d) here", i,
          a.name, a.count, a.adam_group, b.name, b.count, b.adam_group));
    }
  }
  if (local.ok() && m->groups.size() != s.options.groups.size()) {
    local = mismatch(absl::StrFormat("it has %d hyper-parameter groups, this engine %d",
                                     m->groups.size(), s.options.groups.size()));
  }
  absl::StatusOr<ZeroLayout> then = absl::UnknownError("unplanned");
  if (local.ok()) {
    then = ZeroLayout::plan(m->params, m->ranks, m->group_elements, m->alignment);
    local = then.status();
  }
  // Which records this rank reads, verified now (read again when installed).
  std::vector<std::vector<SourcePiece>> sources(s.groups.size());
  if (local.ok()) {
    RecordReader reader(directory, *m, *then);
    for (uint32_t g = 0; g < s.groups.size() && local.ok(); ++g) {
      sources[g] = sources_of(s.layout, s.rank, g, *then);
      for (const SourcePiece& p : sources[g]) {
        if (auto record = reader.read(p.rank, p.group); !record.ok()) {
          local = record.status();
          break;
        }
      }
    }
  }
  auto failed = failed_ranks(s.comm, local.ok());
  if (!failed.ok()) return s.fail(failed.status());
  if (!failed->empty()) {
    return absl::Status(
        local.ok() ? absl::StatusCode::kAborted : local.code(),
        absl::StrCat("ZeroEngine::load(", directory, "): rank(s) ", rank_list(*failed),
                     " cannot use the checkpoint", local.ok() ? "" : ": ", local.message(),
                     "; nothing was loaded"));
  }

  // Install: every slice's states, then the counters, then gather the parameters.
  RecordReader reader(directory, *m, *then);
  for (uint32_t g = 0; g < s.groups.size() && local.ok(); ++g) {
    const uint64_t shard = s.layout.groups()[g].shard;
    std::vector<float> master(shard, 0.0F), exp_avg(shard, 0.0F), exp_avg_sq(shard, 0.0F);
    for (const SourcePiece& p : sources[g]) {
      auto record = reader.read(p.rank, p.group);
      if (!record.ok()) {
        local = record.status();
        break;
      }
      const uint64_t old_shard = then->groups()[p.group].shard;
      const float* base = (*record)->data() + p.record_offset;
      std::copy_n(base, p.count, master.begin() + static_cast<ptrdiff_t>(p.slice_offset));
      std::copy_n(base + old_shard, p.count,
                  exp_avg.begin() + static_cast<ptrdiff_t>(p.slice_offset));
      std::copy_n(base + 2 * old_shard, p.count,
                  exp_avg_sq.begin() + static_cast<ptrdiff_t>(p.slice_offset));
    }
    if (local.ok()) {
      local =
          s.optimizer->write_state(s.groups[g].shard, master, exp_avg, exp_avg_sq, m->shard_steps);
    }
  }
  for (uint32_t g = 0; g < m->groups.size() && local.ok(); ++g) {
    local = s.optimizer->set_group(g, m->groups[g]);
  }
  if (local.ok()) {
    local = s.optimizer->set_scaler_state({m->step, m->loss_scale, m->good_steps});
  }
  // A failure from here on leaves the ranks with different states: the engine stops.
  failed = failed_ranks(s.comm, local.ok());
  if (!failed.ok()) return s.fail(failed.status());
  if (!failed->empty()) {
    return s.fail(absl::Status(
        local.ok() ? absl::StatusCode::kAborted : local.code(),
        absl::StrCat("ZeroEngine::load(", directory, "): rank(s) ", rank_list(*failed),
                     " failed while installing the states", local.ok() ? "" : ": ", local.message(),
                     "; the engine is unusable: create it again and load")));
  }
  if (auto st = s.gather_params(); !st.ok()) return s.fail(st);
  if (auto st = s.drop_host_copies(); !st.ok()) return s.fail(st);
  // Gradients of micro-steps before the load belong to the old weights.
  return s.clear_gradients("load()");
}

absl::Status ZeroEngine::read_state(ZeroParamId id, std::span<float> master,
                                    std::span<float> exp_avg, std::span<float> exp_avg_sq) {
  Impl& s = *impl_;
  if (auto st = s.check_param(id); !st.ok()) return st;
  const ZeroSegment& seg = s.layout.param_segment(id.index);
  for (auto [span, what] : {std::pair{master, "master"}, std::pair{exp_avg, "exp_avg"},
                            std::pair{exp_avg_sq, "exp_avg_sq"}}) {
    if (!span.empty() && span.size() != seg.count) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ZeroEngine::read_state(%s): %s holds %d values; the parameter has %d",
                          s.layout.params()[id.index].name, what, span.size(), seg.count));
    }
  }
  MutexLock step_lock(&s.step_mu);
  s.wait_for_reductions();
  if (auto st = s.failure(); !st.ok()) return st;
  const ZeroFlatGroup& fg = s.layout.groups()[seg.group];
  std::vector<float> mine(3 * fg.shard);
  const std::span<float> all(mine);
  absl::Status local =
      s.optimizer->read_state(s.groups[seg.group].shard, all.subspan(0, fg.shard),
                              all.subspan(fg.shard, fg.shard), all.subspan(2 * fg.shard, fg.shard));
  // Every rank gathers even when its read failed, so that no rank waits for it.
  std::vector<float> gathered(3 * fg.padded);
  auto work = s.comm.all_gather(mine.data(), gathered.data(), 3 * fg.shard, DataType::kFloat32);
  if (!work.ok()) return s.fail(work.status());
  if (auto st = (*work)->wait(); !st.ok()) return s.fail(st);
  if (!local.ok()) return local;
  // Rank r's block is [master | exp_avg | exp_avg_sq] of its slice.
  std::span<float> outs[3] = {master, exp_avg, exp_avg_sq};
  for (uint64_t e = 0; e < seg.count; ++e) {
    const uint64_t at = seg.group_offset + e;
    const uint64_t r = at / fg.shard;
    const uint64_t within = at % fg.shard;
    for (int a = 0; a < 3; ++a) {
      if (!outs[a].empty()) outs[a][e] = gathered[r * 3 * fg.shard + a * fg.shard + within];
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
