// examples/common/cli.hpp — the trainers' command-line reading (resnet_fmnist, resnet_pipeline).
#pragma once

#include <cstdlib>
#include <string>

namespace braid_examples {

using usage_fn = void (*)(const char*); // prints why and the usage, and exits

// The value of flag argv[i], which is argv[i + 1] (i moves past it); usage() when there is none.
inline std::string flag_value(int argc, char** argv, int& i, usage_fn usage) {
  const std::string flag = argv[i];
  if (i + 1 >= argc) usage(("missing value for " + flag).c_str());
  return argv[++i];
}
// The same, read as a number (all of it); usage() when it is not one.
inline double flag_number(int argc, char** argv, int& i, usage_fn usage) {
  const std::string flag = argv[i], v = flag_value(argc, argv, i, usage);
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end) usage(("not a number: " + flag + " " + v).c_str());
  return d;
}

} // namespace braid_examples
