// The HTML page shared by `troupe dashboard` (live) and `troupe report`
// (self-contained): launch/observe/web/dashboard.html and dashboard.js, embedded at
// build time, with the chart libraries of Debian's libjs-dygraphs and
// libjs-d3 linked (live) or inlined (report).
#pragma once

#include <string>
#include <vector>

#include "launch/observe/run_dir.hpp"

namespace troupe::launch {

// Where Debian installs the JS packages; the dashboard serves them from here.
inline constexpr const char* kJsRoot = "/usr/share/javascript";

// The live page: scripts from /js/dygraphs/... and /js/d3/... (served from kJsRoot).
std::string live_page();
// One file with the libraries, the app and the runs' metrics, log tail and
// trace inlined. Throws std::runtime_error when a library is not installed.
std::string static_page(const std::vector<RunDir>& runs);

}  // namespace troupe::launch
