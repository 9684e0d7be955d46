// One line of progress on stderr for the commands (compile stages, bench
// runs, training steps).
#pragma once

#include <unistd.h>

#include <iostream>
#include <string>

namespace kiln::cli {

// One line of progress on stderr while it is a terminal (nothing otherwise):
// the compile's stages, then bench's runs. Cleared before results print.
class Progress {
 public:
  Progress() : enabled_(isatty(STDERR_FILENO) != 0) {}
  ~Progress() { clear(); }
  bool enabled() const { return enabled_; }
  void show(const std::string& text) {
    if (!enabled_) return;
    std::cerr << "\r\033[K" << text << std::flush;
    shown_ = true;
  }
  void clear() {
    if (!enabled_ || !shown_) return;
    std::cerr << "\r\033[K" << std::flush;
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
};

inline Progress& progress() {
  static Progress p;
  return p;
}

}  // namespace kiln::cli
