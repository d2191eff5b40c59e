#include "report.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace gdn::app {

void Report::finish(bool ok) {
  if (!printer_ || !json_) return;
  doc_["ok"] = ok;
  // NaN and infinite values (a failed check) come out as null, which JSON readers accept.
  fmt::print("{}\n", doc_.dump(2));
  std::fflush(stdout);
}

std::chrono::milliseconds Progress::delay() {
  const char* value = std::getenv("GDN_PROGRESS_MS");
  if (value && *value) {
    char* end = nullptr;
    errno = 0;
    const long long ms = std::strtoll(value, &end, 10);
    if (errno == 0 && *end == '\0' && ms >= 0) return std::chrono::milliseconds(ms);
  }
  return std::chrono::milliseconds(2000);
}

Progress::Progress(const Report& report, std::string what) {
  if (!report.printer()) return;
  const std::chrono::milliseconds wait = delay();
  if (wait.count() == 0) {
    fmt::print(stderr, "gdn: {}...\n", what);
    return;
  }
  watcher_ = std::thread([this, wait, what = std::move(what)] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_changed_.wait_for(lock, wait, [this] { return done_; }))
      fmt::print(stderr, "gdn: {}...\n", what);
  });
}

Progress::~Progress() {
  if (!watcher_.joinable()) return;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_changed_.notify_one();
  watcher_.join();
}

}  // namespace gdn::app
