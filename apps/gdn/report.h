#pragma once
// What gdn run tells the user: lines of text on stdout as each step finishes or, with --json,
// one JSON document on stdout at the end; and, either way, progress on stderr for steps that
// outlast a few seconds. Only the printing rank (rank 0 under mpirun) writes anything.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace gdn::app {

class Report {
 public:
  Report(bool json, bool printer) : json_(json), printer_(printer) {}

  bool printer() const { return printer_; }
  bool json() const { return json_; }

  // Text for the user, printed now unless --json.
  template <typename... Args>
  void text(fmt::format_string<Args...> format, Args&&... args) const {
    if (printer_ && !json_) fmt::print(format, std::forward<Args>(args)...);
  }

  // The document --json prints, its keys in the order added (every rank may fill it; only the
  // printer prints it).
  nlohmann::ordered_json& doc() { return doc_; }

  // With --json, adds "ok" and prints the document on stdout.
  void finish(bool ok);

 private:
  bool json_, printer_;
  nlohmann::ordered_json doc_ = nlohmann::ordered_json::object();
};

// One step of a command: when it is still running after GDN_PROGRESS_MS milliseconds (2000
// unless the environment says otherwise; 0 says it at once), "gdn: <what>..." goes to stderr.
// Short steps stay silent; stdout is never touched.
class Progress {
 public:
  Progress(const Report& report, std::string what);
  ~Progress();  // the step is over
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  static std::chrono::milliseconds delay();  // GDN_PROGRESS_MS, or 2000 ms

 private:
  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::thread watcher_;
};

}  // namespace gdn::app
