// Assembles the dashboard page (launch/observe/web_page.hpp) from the embedded
// template and app script.
#include "launch/observe/web_page.hpp"

#include <chrono>
#include <ctime>
#include <stdexcept>

#include "launch/observe/progress.hpp"

namespace troupe::launch {

extern const char* const kDashboardHtml;  // launch/observe/web/dashboard.html
extern const char* const kDashboardJs;    // launch/observe/web/dashboard.js

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

void replace_marker(std::string& page, const std::string& marker, const std::string& with) {
  const auto at = page.find(marker);
  if (at == std::string::npos) throw std::logic_error("dashboard.html lacks " + marker);
  page.replace(at, marker.size(), with);
}

// Script text that cannot end its <script> element early.
std::string script_safe(std::string js) {
  replace_all(js, "</script", "<\\/script");
  replace_all(js, "</SCRIPT", "<\\/SCRIPT");
  replace_all(js, "<!--", "<\\!--");
  return js;
}

std::string library(const std::string& rel, const char* package) {
  const std::string path = std::string(kJsRoot) + "/" + rel;
  auto text = read_whole_file(path);
  if (!text) throw std::runtime_error(path + " not found: install Debian's " + package + " (./setup.sh does)");
  // Source maps are not shipped inside the report.
  const auto map = text->rfind("//# sourceMappingURL=");
  if (map != std::string::npos) text->erase(map);
  const auto cmap = text->rfind("/*# sourceMappingURL=");
  if (cmap != std::string::npos) text->erase(cmap);
  return *text;
}

std::string app_script() { return "<script>\n" + script_safe(kDashboardJs) + "\n</script>"; }

}  // namespace

std::string live_page() {
  std::string page = kDashboardHtml;
  replace_marker(page, "<!--TROUPE_LIBS-->",
                 "<link rel=\"stylesheet\" href=\"/js/dygraphs/dygraph.css\">\n"
                 "<script src=\"/js/dygraphs/dygraph.min.js\"></script>\n"
                 "<script src=\"/js/d3/d3.min.js\"></script>");
  replace_marker(page, "<!--TROUPE_DATA-->", "");
  replace_marker(page, "<!--TROUPE_APP-->", app_script());
  return page;
}

std::string static_page(const std::vector<RunDir>& runs) {
  std::string page = kDashboardHtml;
  replace_marker(page, "<!--TROUPE_LIBS-->",
                 "<style>\n" + library("dygraphs/dygraph.css", "libjs-dygraphs") + "\n</style>\n<script>\n" +
                     script_safe(library("dygraphs/dygraph.min.js", "libjs-dygraphs")) + "\n</script>\n<script>\n" +
                     script_safe(library("d3/d3.min.js", "libjs-d3")) + "\n</script>");
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::string data = "{\"generated\":" + json_escape(when) + ",\"runs\":[";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunDir& r = runs[i];
    const MetricsChunk m = read_metrics(r, 0, uint64_t{1} << 30);
    const std::string trace = trace_path(r);
    const auto trace_text = trace.empty() ? std::nullopt : read_whole_file(trace, 64u << 20);
    data += std::string(i ? "," : "") + "{\"name\":" + json_escape(r.name) + ",\"dir\":" + json_escape(r.path) +
            ",\"metrics\":" + json_escape(m.text) + ",\"log\":" + json_escape(read_log_tail(r, 64u << 10).value_or("")) +
            ",\"trace\":" + (trace_text ? json_escape(*trace_text) : "null") + "}";
  }
  data += "]}";
  replace_all(data, "</", "<\\/");  // "\/" is "/" inside a JSON string
  replace_all(data, "<!--", "<\\u0021--");
  replace_marker(page, "<!--TROUPE_DATA-->", "<script>window.TROUPE_STATIC = " + data + ";</script>");
  replace_marker(page, "<!--TROUPE_APP-->", app_script());
  return page;
}

}  // namespace troupe::launch
