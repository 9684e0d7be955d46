#include "support/collective.h"

#include <mutex>

namespace kiln {

namespace {
std::mutex g_mu;
std::shared_ptr<const Collective> g_collective;
}  // namespace

void set_collective(std::shared_ptr<const Collective> c) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_collective = std::move(c);
}

std::shared_ptr<const Collective> collective() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_collective;
}

}  // namespace kiln
