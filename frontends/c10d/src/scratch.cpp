// scratch.cpp - see scratch.hpp.
#include "scratch.hpp"

#include <algorithm>

namespace mep_c10d {

at::Tensor ScratchPool::take(MepWork &w, int64_t numel, at::ScalarType st) {
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(st));
  at::Tensor buf;
  {
    std::lock_guard<std::mutex> g(mu_);
    // The smallest idle buffer that fits.
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (it->numel() >= bytes &&
          (best == idle_.end() || it->numel() < best->numel()))
        best = it;
    if (best != idle_.end()) {
      buf = std::move(*best);
      idle_.erase(best);
    }
  }
  if (!buf.defined())
    buf = at::empty({std::max<int64_t>(bytes, 1)},
                    at::TensorOptions(at::kByte));
  auto self = shared_from_this();
  w.keep_alive(std::shared_ptr<void>(
      nullptr, [self, buf](void *) { self->give_back(buf); }));
  return buf.narrow(0, 0, bytes).view(st);
}

void ScratchPool::give_back(at::Tensor buf) {
  std::lock_guard<std::mutex> g(mu_);
  idle_.push_back(std::move(buf));
  auto total = [&] {
    int64_t n = 0;
    for (const auto &b : idle_) n += b.numel();
    return n;
  };
  while (idle_.size() > kKeep || (idle_.size() > 1 && total() > kMaxIdleBytes)) {
    // Keep the largest: they serve every smaller request too.
    auto smallest = std::min_element(
        idle_.begin(), idle_.end(), [](const at::Tensor &a, const at::Tensor &b) {
          return a.numel() < b.numel();
        });
    idle_.erase(smallest);
  }
}

}  // namespace mep_c10d
